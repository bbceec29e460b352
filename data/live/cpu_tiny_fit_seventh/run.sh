#!/usr/bin/env bash
# The fit campaign's exact command (data/live/cpu_tiny_fit/run.sh) recorded again on 2026-12-05
# from 23:05 UTC, on a quiet machine, minutes before the seventh pre-registered draw
# (data/live/cpu_tiny_prereg_seventh) was predicted from it and recorded. Why: the sixth draw
# was predicted from a fit campaign recorded three hours before it, and its lone requests'
# decode steps were 0.3-0.8 ms (12-30 %) slower than at that fit (notebook 06,
# `validate.machine_table`); the fifth draw, recorded minutes after its fit, met ~0.1 ms.
# A first recording from 22:44 was set aside, not committed: its baseline tier ran beside the
# author's own scripts (0.057 CPU outside the run against 0.004-0.017 in the other fit
# recordings, `analysis.runs.outside_cpu`), and its lone decode steps' rms was 1.10 ms (0.26).
set -euo pipefail
out="${1:-data/live/cpu_tiny_fit_seventh}"
bash data/live/cpu_tiny_fit/run.sh "$out"
find "$out" -name '*.log' -exec gzip -9f {} +
