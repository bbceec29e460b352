"""The pre-registered held-out runs (kvrepro.calibration.preregister): the plan is the one
validation reads, every set has its committed predictions, each recorded run started after
its predictions were committed (git history vs meta.json), and a prediction is refused once
a set is recorded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from kvrepro._paths import data_file
from kvrepro.calibration import preregister, validate
from kvrepro.engines.live.tiers import read_tier_config
from kvrepro.records import read_run

PLAN = preregister.load_plan()
ROOT = data_file("live", preregister.PREREG_ROOT)


def test_the_plan_is_the_validation_sets() -> None:
    assert PLAN.tiers == list(validate.LIVE_TIERS)


def test_every_set_has_a_prediction_for_every_tier_and_metric() -> None:
    for name in PLAN.sets:
        table = pd.read_csv(ROOT / name / preregister.PREDICTIONS)
        pairs = set(zip(table.tier, table.metric, strict=True))
        assert pairs == {(t, m) for t in PLAN.tiers for m in validate.METRICS}, name
        assert table.predicted.notna().sum() > len(PLAN.tiers) * 5, name


def test_recorded_runs_started_after_their_predictions_were_committed() -> None:
    table = preregister.protocol_table(PLAN)
    recorded = table[table.recorded_utc.notna()]
    assert len(recorded), "no pre-registered set is recorded"
    late = recorded[~recorded.predicted_first]
    assert late.empty, late.to_string()


def test_a_planned_run_is_what_the_live_engine_will_deploy() -> None:
    """The twin's prediction reads the same rendered tier and workload digest as the
    recorded run's meta.json."""
    for name in PLAN.sets:
        for tier in PLAN.tiers:
            folder = ROOT / name / tier
            if not (folder / "meta.json").exists():
                continue
            recorded = read_run(folder).meta
            planned = preregister.planned_meta(PLAN, name, tier,
                                               preregister.set_server(PLAN, name))
            assert planned["workload_digest"] == recorded["workload_digest"], (name, tier)
            ports = {"port", "lmcache_mp"}  # chosen free at deploy time
            assert (read_tier_config(planned["tier_config"]).model_dump(exclude=ports)
                    == read_tier_config(recorded["tier_config"]).model_dump(exclude=ports)
                    ), (name, tier)


def test_predictions_are_refused_for_a_recorded_set(tmp_path: Path) -> None:
    one = next(iter(PLAN.sets))
    plan = PLAN.model_copy(update={"sets": {one: PLAN.sets[one]}})
    (tmp_path / one / "dram").mkdir(parents=True)
    shutil.copy(ROOT / "plan.yaml", tmp_path / "plan.yaml")
    (tmp_path / one / "dram" / "meta.json").write_text("{}")
    with pytest.raises(ValueError, match="recorded already"):
        preregister.write_predictions(plan, tmp_path)
    with pytest.raises(ValueError, match="no predictions.csv"):
        preregister.record_set(plan, one, tmp_path / "elsewhere")


def test_prediction_drift_is_measured_against_the_committed_numbers() -> None:
    stored = pd.DataFrame({"tier": ["dram"] * 2, "metric": ["a", "b"],
                           "predicted": [1.0, 0.0]})
    today = stored.assign(predicted=[1.1, 0.5])
    assert preregister._drift(stored, today, "dram") == pytest.approx(0.5)
    assert preregister._drift(stored, stored, "dram") == 0.0
