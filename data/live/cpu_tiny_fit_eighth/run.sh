#!/usr/bin/env bash
# The fit campaign's exact command (data/live/cpu_tiny_fit/run.sh) recorded again on 2026-12-06
# from about 01:40 UTC, on a quiet machine, minutes before the eighth pre-registered draw
# (data/live/cpu_tiny_prereg_eighth) was predicted from it and recorded, as the seventh's was
# (data/live/cpu_tiny_fit_seventh/run.sh says why: the machine's decode speed moves between
# hours). The eighth draw scores the twin's queue time counted as vLLM counts it (from the
# engine core's intake after the step in flight) and the engine's intake time measured.
set -euo pipefail
out="${1:-data/live/cpu_tiny_fit_eighth}"
bash data/live/cpu_tiny_fit/run.sh "$out"
find "$out" -name '*.log' -exec gzip -9f {} +
