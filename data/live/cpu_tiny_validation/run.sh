#!/usr/bin/env bash
# The exact commands that produced this folder's held-out runs (from the project root, after
# make live-cpu). None of them was used to fit anything: the twin's step time is fitted on
# data/live/cpu_tiny and its offload stores on data/live/cpu_tiny_lmcache (seed 3, 20
# sessions/min, 512 MiB L1, context cap 7,680). Each set runs the three tiers one after another.
#   a-seed-rate   another seed (7) and session rate (14 / min)
#   b-saturating  60 sessions / min: the server falls behind (queueing dominates p90 TTFT)
#   c-l1-cap      another L1 size (256 MiB) and context cap (5,120 tokens), seed 11
set -euo pipefail
out="${1:-data/live/cpu_tiny_validation}"
common=(--server data/servers/cpu_tiny.yaml --tier small-kv --tier dram --tier flash
  --workload agentic -w duration_s=300 -w warmup_s=30
  -w "tool_tokens=[100, 300]" -w "file_tokens=[600, 1500]"
  -w "short_output_tokens=[10, 40]" -w "code_tokens=[60, 150]" -w jitter_tokens=20
  -w "pause={kind: lognormal, mean_s: 1.0, sigma: 1.0}" -w p_returning=0.3
  -w idle_after_turns=8 -w idle_after_jitter_turns=2 -w idle_s=120 -w idle_jitter_s=20
  --duration-s 300 --warmup-s 30)
.venv/bin/kvrepro run live "${common[@]}" -w seed=7 -w session_rate_per_min=14 \
  -w context_cap_tokens=7680 --out "$out/a-seed-rate"
.venv/bin/kvrepro run live "${common[@]}" -w seed=5 -w session_rate_per_min=60 \
  -w context_cap_tokens=7680 --out "$out/b-saturating"
.venv/bin/kvrepro run live "${common[@]}" -w seed=11 -w session_rate_per_min=20 \
  -w context_cap_tokens=5120 -p tiers.dram.stores.0.capacity_bytes=268435456 \
  --out "$out/c-l1-cap"
