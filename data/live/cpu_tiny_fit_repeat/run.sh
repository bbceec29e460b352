#!/usr/bin/env bash
# The fit campaign's exact command (data/live/cpu_tiny_fit/run.sh, all three tiers) recorded
# again on 2026-12-05 04:49-05:07 UTC at cd78b26, on a quiet machine with the spec's CPU
# placement: a replicate, not a fit and not a held-out run. With the fit run (2026-12-02) and
# the drift probe (data/live/cpu_tiny_drift, the baseline tier, 2026-12-05 03:10) it measures
# how far the live stack reproduces itself (validate.replication_table, notebook 06): the
# floor under any twin's error on runs recorded at another time.
set -euo pipefail
out="${1:-data/live/cpu_tiny_fit_repeat}"
bash data/live/cpu_tiny_fit/run.sh "$out"
find "$out" -name '*.log' -exec gzip -9f {} +
