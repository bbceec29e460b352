#!/usr/bin/env bash
# The commands that record this folder's held-out sets (plan.yaml), from the project root after
# `make live-cpu`, on a quiet machine, only after every set's predictions.csv is committed
# (`python -m kvrepro.calibration.preregister check --plan data/live/cpu_tiny_prereg_eighth/plan.yaml`
# verifies the order afterwards). Each set runs its three tiers one after another (small-kv,
# dram, flash), the tiny server's placement in every tier (like with like).
# Before it, in order: `bash data/live/cpu_tiny_fit_eighth/run.sh` (the fit campaign),
# `.venv/bin/python -m kvrepro.calibration --attention-rate --prefill-request-from
# data/live/cpu_tiny_fit_one_session --engine-intake data/live/cpu_tiny_fit_eighth
# data/live/cpu_tiny_prereg_eighth/cpu_tiny.yaml` (the plan's spec, by the fit routine),
# `... preregister predict --plan data/live/cpu_tiny_prereg_eighth/plan.yaml`, then the commit.
set -euo pipefail
PLAN=data/live/cpu_tiny_prereg_eighth/plan.yaml
for set in a-seed-rate b-saturating c-l1-cap d-decode-heavy e-returning; do
  .venv/bin/python -m kvrepro.calibration.preregister record "$set" --plan "$PLAN"
done
find "$(dirname "$PLAN")" -name '*.log' -exec gzip -9f {} +
