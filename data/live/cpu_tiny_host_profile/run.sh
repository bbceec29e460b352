#!/usr/bin/env bash
# The commands that produced this folder (2026-12-04 23:17-23:24 UTC, on this repository's
# 2-core machine, from the project root after `make live-cpu` and `make py-spy`): the fit
# campaign's workload (data/live/cpu_tiny_fit/run.sh, 150 s instead of 300 s) on the small-kv
# and dram tiers, and 40 s into each tier's load, 60 s of py-spy (100 Hz, --nonblocking, only
# running threads) on vLLM's engine core, worker and API server. The stacks are gzipped into
# stacks/ afterwards, named by role (profile.yaml), with the logs.
set -euo pipefail
OUT="${1:-data/live/cpu_tiny_host_profile}"
PYSPY="${PYSPY:-.venv/bin/py-spy}"
.venv/bin/kvrepro run live --server data/servers/cpu_tiny.yaml \
  --tier small-kv --tier dram --workload agentic \
  -w seed=3 -w duration_s=150 -w warmup_s=30 -w session_rate_per_min=6 \
  -w context_cap_tokens=7680 -w "tool_tokens=[100, 300]" -w "file_tokens=[600, 1500]" \
  -w "short_output_tokens=[10, 40]" -w "code_tokens=[60, 150]" -w jitter_tokens=20 \
  -w "pause={kind: lognormal, mean_s: 1.0, sigma: 1.0}" -w p_returning=0.3 \
  -w idle_after_turns=8 -w idle_after_jitter_turns=2 -w idle_s=120 -w idle_jitter_s=20 \
  --duration-s 150 --warmup-s 30 --out "$OUT" &
mkdir -p "$OUT/stacks"
for tier in small-kv dram; do
  until [ -s "$OUT/$tier/records.jsonl" ]; do sleep 2; done
  sleep 40
  for role in engine_core:VLLM::EngineCore worker:VLLM::Worker \
              api_server:vllm.entrypoints.openai.api_server; do
    pid=$(pgrep -f "${role#*:}" | head -1)
    "$PYSPY" record --nonblocking --rate 100 --duration 60 --format raw --pid "$pid" \
      -o "$OUT/stacks/$tier-${role%%:*}.txt" &
  done
  sleep 65
done
wait
gzip -9f "$OUT"/stacks/*.txt
find "$OUT" -name '*.log' -exec gzip -9f {} +
