#!/usr/bin/env bash
# The diagnostic fleet run of data/live/cpu_tiny_fleet_wait (its run.sh: two instances,
# shared DRAM, round robin, 6 sessions / min, a 120 s window; not pre-registered) recorded
# again on 2026-12-05 at 81ffd51 with each process's main-thread timeslices in its samples
# (proc_<role>_runqueue_slices): how often each process ran and how long it waited for a
# CPU each time (analysis.fleet_live.fleet_process_cpu, notebook 13).
set -euo pipefail
bash data/live/cpu_tiny_fleet_wait/run.sh "${1:-data/live/cpu_tiny_fleet_slices}"
