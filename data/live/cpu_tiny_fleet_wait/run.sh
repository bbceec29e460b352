#!/usr/bin/env bash
# A diagnostic fleet run (issue [host-cpu]; not pre-registered, not used to fit anything):
# the rate6 run of data/live/cpu_tiny_fleet_host (the fleet data/fleets/cpu_tiny_2x.yaml,
# shared DRAM pool, round robin, 6 sessions / min) with a 120 s window, recorded 2026-12-05
# 03:32 UTC at commit 775a42e, whose samples also carry each process's run queue wait
# (`proc_<role>_runqueue_wait_s`: the main thread runnable while another task had its CPU).
# Notebook 13 shows where the instances' processes wait.
set -euo pipefail
.venv/bin/kvrepro run fleet --fleet data/fleets/cpu_tiny_2x.yaml \
  --kv-pool shared --routing round_robin --workload agentic \
  -w seed=3 -w duration_s=210 -w warmup_s=30 \
  -w context_cap_tokens=7680 -w "tool_tokens=[100, 300]" -w "file_tokens=[600, 1500]" \
  -w "short_output_tokens=[10, 40]" -w "code_tokens=[60, 150]" -w jitter_tokens=20 \
  -w "pause={kind: lognormal, mean_s: 1.0, sigma: 1.0}" -w p_returning=0.3 \
  -w idle_after_turns=8 -w idle_after_jitter_turns=2 -w idle_s=120 -w idle_jitter_s=20 \
  -w session_rate_per_min=6 --duration-s 120 --warmup-s 30 \
  --out "${1:-data/live/cpu_tiny_fleet_wait}"
find "${1:-data/live/cpu_tiny_fleet_wait}" -name '*.log' -exec gzip -9f {} +
