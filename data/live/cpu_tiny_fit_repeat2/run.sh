#!/usr/bin/env bash
# The fit campaign's exact command (data/live/cpu_tiny_fit/run.sh) recorded a fourth time, on
# 2026-12-05 05:11-05:29 UTC at c2bb058, right after the first replicate
# (data/live/cpu_tiny_fit_repeat): its runs carry the speed probe before and after each tier
# (meta.json's speed_probe) and the host CPUs' busy and steal seconds in their samples
# (validate.replicate_conditions, notebook 06).
set -euo pipefail
out="${1:-data/live/cpu_tiny_fit_repeat2}"
bash data/live/cpu_tiny_fit/run.sh "$out"
find "$out" -name '*.log' -exec gzip -9f {} +
