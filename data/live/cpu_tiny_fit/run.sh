#!/usr/bin/env bash
# The exact command that produced this folder's runs (from the project root, after
# make live-cpu): the tiny server's fit campaign. The twin's step time is fitted on its
# small-kv tier and its offload costs on its dram and flash tiers
# (python -m kvrepro.calibration data/live/cpu_tiny_fit data/servers/cpu_tiny.yaml).
# Study A's shape (seed 3, a 7,680-token context cap), 5 minutes a tier, at 6 sessions / min:
# with one engine thread on this machine 20 / min (the earlier fit runs' rate) saturated every
# tier (a run at 20 / min on 2026-12-02: median TTFT 7.3 s on small-kv, its only lone requests
# in the first 25 s), and the step time is fitted on lone requests, so they must come from the
# whole run. Recorded 2026-12-02 on a quiet machine with the spec's CPU placement (every tier:
# vLLM's worker alone on CPU 0, everything else on CPU 1; each meta.json's placement), before
# the pre-registered held-out runs of data/live/cpu_tiny_prereg were predicted.
set -euo pipefail
.venv/bin/kvrepro run live --server data/servers/cpu_tiny.yaml \
  --tier small-kv --tier dram --tier flash --workload agentic \
  -w seed=3 -w duration_s=300 -w warmup_s=30 -w session_rate_per_min=6 \
  -w context_cap_tokens=7680 -w "tool_tokens=[100, 300]" -w "file_tokens=[600, 1500]" \
  -w "short_output_tokens=[10, 40]" -w "code_tokens=[60, 150]" -w jitter_tokens=20 \
  -w "pause={kind: lognormal, mean_s: 1.0, sigma: 1.0}" -w p_returning=0.3 \
  -w idle_after_turns=8 -w idle_after_jitter_turns=2 -w idle_s=120 -w idle_jitter_s=20 \
  --duration-s 300 --warmup-s 30 --out "${1:-data/live/cpu_tiny_fit}"
