#!/usr/bin/env bash
# The commands that record this folder's runs (plan.yaml), from the project root after
# `make live-cpu`, on a quiet machine, only after its campaign's predictions.csv is
# committed (kvrepro.studies.fleet_prereg; `python -m kvrepro.studies.fleet_prereg check
# data/live/cpu_tiny_fleet_ring_prereg/plan.yaml` verifies the order afterwards). rate20: the two
# session-affinity runs of data/live/cpu_tiny_fleet_one_session_rest/run.sh again, with the
# same command, every server in this shell's session.
set -euo pipefail
OUT="${1:-data/live/cpu_tiny_fleet_ring_prereg}"
COMMON=(--workload agentic
  -w seed=3 -w duration_s=210 -w warmup_s=30
  -w context_cap_tokens=7680 -w "tool_tokens=[100, 300]" -w "file_tokens=[600, 1500]"
  -w "short_output_tokens=[10, 40]" -w "code_tokens=[60, 150]" -w jitter_tokens=20
  -w "pause={kind: lognormal, mean_s: 1.0, sigma: 1.0}" -w p_returning=0.3
  -w idle_after_turns=8 -w idle_after_jitter_turns=2 -w idle_s=120 -w idle_jitter_s=20
  --duration-s 210 --warmup-s 30)
.venv/bin/kvrepro run fleet --fleet data/fleets/cpu_tiny_2x.yaml \
  --kv-pool shared --kv-pool private --routing session_affinity \
  "${COMMON[@]}" -w session_rate_per_min=20 --out "$OUT/rate20"
find "$OUT" -name '*.log' -exec gzip -9f {} +
