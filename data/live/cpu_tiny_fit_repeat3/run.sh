#!/usr/bin/env bash
# The fit campaign's exact command (data/live/cpu_tiny_fit/run.sh) recorded a fifth time, on
# 2026-12-05 from 14:59 UTC at d1c9482, on a quiet machine: the same-day fit that a fourth
# pre-registered draw of the held-out sets is predicted from (its plan's fitted_on,
# data/live/cpu_tiny_prereg_fourth/plan.yaml).
set -euo pipefail
out="${1:-data/live/cpu_tiny_fit_repeat3}"
bash data/live/cpu_tiny_fit/run.sh "$out"
find "$out" -name '*.log' -exec gzip -9f {} +
