"""The CI guard of the twin's fidelity: the twin runs the shipped held-out live runs'
workloads (data/live/cpu_tiny_validation, never used for fitting) and every metric must stay
within its tolerance in data/live/cpu_tiny_validation/tolerances.yaml, so that a change to
the simulator, the workload generator or the fitted spec that loses fidelity cannot land
unnoticed. The tolerances are what the twin reaches today plus a small margin, stated in the
file; notebook 06 shows the table they come from."""

from __future__ import annotations

import math

import pytest
import yaml

from kvrepro._paths import data_file
from kvrepro.calibration import validate
from kvrepro.engines.sim import load_profile

TOLERANCES = data_file("live", validate.HELD_OUT_ROOT, "tolerances.yaml")
NOT_APPLICABLE = {("small-kv", "l1_hit_share"), ("small-kv", "l2_hit_share"),
                  ("small-kv", "l1_fill_s"), ("dram", "l2_hit_share"),
                  ("flash", "l1_hit_share"), ("flash", "l1_fill_s")}
"""(tier, metric) pairs without an error: no offload store, no disk, LMCache's pass-through
L1 with skip_l1 (no L1 hits counted, no fill)."""


@pytest.fixture(scope="module")
def held_out():
    runs = validate.shipped_runs()
    held = {name: dirs for name, dirs in runs.items() if name in validate.HELD_OUT_SETS}
    profile = load_profile(data_file("servers", "cpu_tiny.yaml"))
    return validate.validation_table(held, profile)[0]


@pytest.fixture(scope="module")
def tolerances() -> dict:
    return yaml.safe_load(TOLERANCES.read_text())


def test_every_held_out_run_and_tier_is_checked(held_out) -> None:
    pairs = set(map(tuple, held_out[["run", "tier"]].drop_duplicates().to_numpy()))
    assert pairs == {(r, t) for r in validate.HELD_OUT_SETS for t in validate.LIVE_TIERS}


def test_errors_exist_exactly_where_a_metric_applies(held_out) -> None:
    for row in held_out.itertuples():
        applies = (row.tier, row.metric) not in NOT_APPLICABLE
        fill_never = row.metric == "l1_fill_s" and math.isnan(row.live) and math.isnan(row.sim)
        if applies and not fill_never:
            assert math.isfinite(row.error_pct), f"{row.run} {row.tier} {row.metric}: {row}"
        elif not applies:
            assert not math.isfinite(row.error_pct), f"{row.run} {row.tier} {row.metric}"


def test_every_metric_stays_within_its_tolerance(held_out, tolerances) -> None:
    limits = tolerances["max_abs_error_pct"]
    assert set(limits) == set(validate.METRICS)
    misses = [f"{r.run} {r.tier} {r.metric}: live {r.live:.4g}, sim {r.sim:.4g}, "
              f"{r.error_pct:+.1f} % (tolerance {limits[r.metric]} %)"
              for r in held_out.dropna(subset=["error_pct"]).itertuples()
              if abs(r.error_pct) > limits[r.metric]]
    assert not misses, "\n".join(misses)


def test_median_error_stays_within_its_tolerance(held_out, tolerances) -> None:
    assert validate.summary(held_out)["median_abs_error_pct"] \
        <= tolerances["median_abs_error_pct"]
