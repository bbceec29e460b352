#!/usr/bin/env bash
# The exact command that produced this folder's runs (from the project root, after make live-cpu):
# study A's shape on this machine's tiny server, the three tiers one after another
# (small-kv = the baseline, dram = LMCache L1, flash = LMCache L1 staging + O_DIRECT disk).
set -euo pipefail
.venv/bin/kvrepro run live --server data/servers/cpu_tiny.yaml \
  --tier small-kv --tier dram --tier flash --workload agentic \
  -w seed=3 -w duration_s=600 -w warmup_s=30 -w session_rate_per_min=20 \
  -w context_cap_tokens=7680 -w "tool_tokens=[100, 300]" -w "file_tokens=[600, 1500]" \
  -w "short_output_tokens=[10, 40]" -w "code_tokens=[60, 150]" -w jitter_tokens=20 \
  -w "pause={kind: lognormal, mean_s: 1.0, sigma: 1.0}" -w p_returning=0.3 \
  -w idle_after_turns=8 -w idle_after_jitter_turns=2 -w idle_s=120 -w idle_jitter_s=20 \
  --duration-s 600 --warmup-s 30 --out "${1:-data/live/cpu_tiny_lmcache}"
