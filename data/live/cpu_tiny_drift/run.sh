#!/usr/bin/env bash
# A drift probe (issue [host-cpu]): the fit campaign's baseline tier (data/live/cpu_tiny_fit,
# recorded 2026-12-02) recorded again with the same command on 2026-12-05, right after the
# redrawn held-out sets (data/live/cpu_tiny_prereg_host), to tell a change of the machine from
# a miss of the twin: the same workload, config and placement, so any difference of its lone
# requests' decode steps and TTFT from the fit run's is the machine's (notebook 06).
set -euo pipefail
.venv/bin/kvrepro run live --server data/servers/cpu_tiny.yaml \
  --tier small-kv --workload agentic \
  -w seed=3 -w duration_s=300 -w warmup_s=30 -w session_rate_per_min=6 \
  -w context_cap_tokens=7680 -w "tool_tokens=[100, 300]" -w "file_tokens=[600, 1500]" \
  -w "short_output_tokens=[10, 40]" -w "code_tokens=[60, 150]" -w jitter_tokens=20 \
  -w "pause={kind: lognormal, mean_s: 1.0, sigma: 1.0}" -w p_returning=0.3 \
  -w idle_after_turns=8 -w idle_after_jitter_turns=2 -w idle_s=120 -w idle_jitter_s=20 \
  --duration-s 300 --warmup-s 30 --out "${1:-data/live/cpu_tiny_drift}"
find "${1:-data/live/cpu_tiny_drift}" -name '*.log' -exec gzip -9f {} +
