#!/usr/bin/env bash
# The fit campaign's exact command (data/live/cpu_tiny_fit/run.sh) recorded on 2026-12-05 from
# 18:01 UTC, on a quiet machine, after live servers moved into the caller's session (one
# autogroup with the load client: kvrepro.engines.live.processes.ManagedProcess,
# benchmarks/bench_autogroup.py). Every earlier recording had vLLM and the LMCache server in
# sessions of their own, and the client on their CPU stalled 70-400 ms at a time. The fit
# that the fifth pre-registered draw is predicted from (data/live/cpu_tiny_prereg_fifth).
set -euo pipefail
out="${1:-data/live/cpu_tiny_fit_one_session}"
bash data/live/cpu_tiny_fit/run.sh "$out"
find "$out" -name '*.log' -exec gzip -9f {} +
