#!/usr/bin/env bash
# The diagnostic fleet run of data/live/cpu_tiny_fleet_wait (its run.sh: two instances,
# shared DRAM, round robin, 6 sessions / min, a 120 s window; not pre-registered, not used to
# fit anything) recorded again on 2026-12-05 with every server in the caller's session, one
# autogroup with the router's and the load client's threads
# (kvrepro.engines.live.processes.ManagedProcess). data/live/cpu_tiny_fleet_slices is the same
# run with each instance, the router and the LMCache server in sessions of their own: notebook
# 13 sets the two side by side.
set -euo pipefail
bash data/live/cpu_tiny_fleet_wait/run.sh "${1:-data/live/cpu_tiny_fleet_one_session}"
