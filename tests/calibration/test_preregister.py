"""The pre-registered held-out runs (kvrepro.calibration.preregister): the plan is the one
validation reads, every set has its committed predictions, each recorded run started after
its predictions were committed (git history vs meta.json), and a prediction is refused once
a set is recorded; all of it for every plan: the held-out sets and each later draw of them
(`validate.DRAWS`)."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from kvrepro._paths import data_file
from kvrepro.calibration import preregister, validate
from kvrepro.engines.live.tiers import live_tier, read_tier_config
from kvrepro.engines.sim import load_profile
from kvrepro.records import read_run

PLAN = preregister.load_plan()
ROOT = data_file("live", preregister.PREREG_ROOT)
LATER = [data_file("live", folder) for folder, _ in validate.DRAWS[1:]]
PLANS = [pytest.param(root, id=root.name) for root in (ROOT, *LATER)]


def test_the_plan_is_the_validation_sets() -> None:
    assert PLAN.tiers == list(validate.LIVE_TIERS)


@pytest.mark.parametrize("root", [pytest.param(r, id=r.name) for r in LATER])
def test_a_later_draw_is_the_held_out_sets_with_new_seeds(root: Path) -> None:
    """Only the seeds differ, and a draw predicted from a spec the routine wrote
    (`fitted_on`, `fit_options`) deploys exactly the tiers of the package's spec: only the
    twin's constants moved."""
    again = preregister.load_plan(preregister.plan_path(root))
    same = {"sets", "server", "fitted_on", "fit_options"}
    assert again.model_dump(exclude=same) == PLAN.model_dump(exclude=same)
    assert (again.server == PLAN.server) == (again.fitted_on is None)
    assert list(again.sets) == list(PLAN.sets)
    seeds = set()
    for name, held in PLAN.sets.items():
        redrawn = again.sets[name]
        assert redrawn.server == held.server, name
        assert {**redrawn.workload, "seed": None} == {**held.workload, "seed": None}, name
        seeds.add(redrawn.workload["seed"] - held.workload["seed"])
        ours, package = (preregister.set_server(p, name) for p in (again, PLAN))
        for tier in PLAN.tiers:
            assert (live_tier(ours, tier).meta_record()
                    == live_tier(package, tier).meta_record()), (root.name, name, tier)
    assert len(seeds) == 1 and 0 not in seeds, seeds


SAME_DAY = [pytest.param(r, id=r.name) for r in LATER
            if preregister.load_plan(preregister.plan_path(r)).fitted_on]


@pytest.mark.parametrize("root", SAME_DAY)
def test_a_same_day_draw_is_scored_on_the_twin_that_predicted_it(root: Path) -> None:
    """`validation_table`'s `sim` of a draw with its own spec (`draw_profiles`) is that
    spec's twin: on a recorded run it gives the committed predictions, which the package's
    spec does not."""
    suffix = dict(validate.DRAWS)[root.name]
    name = next(iter(preregister.load_plan(preregister.plan_path(root)).sets))
    runs = {validate.redrawn(name, suffix): [root / name / "dram"]}
    package = load_profile(data_file("servers", "cpu_tiny.yaml"))
    ours = preregister.with_predictions(
        validate.validation_table(runs, package, preregister.draw_profiles())[0])
    theirs = validate.validation_table(runs, package)[0]
    committed = preregister._commit_time(root / name / preregister.PREDICTIONS)
    same = ~ours.metric.isin(validate.redefined_since(committed))  # as the twin computed then
    scored = ours[same].dropna(subset=["sim", "predicted"])
    assert len(scored) > 5
    assert scored.sim.to_numpy() == pytest.approx(scored.predicted.to_numpy(), rel=1e-3)
    moved = (theirs.sim - ours.sim).abs() > 0.01 * ours.sim.abs()
    assert moved.any(), "the package's twin gives the same numbers: the test shows nothing"


def test_every_draw_has_its_own_seeds() -> None:
    seeds = [preregister.load_plan(preregister.plan_path(r)).sets["a-seed-rate"]
             .workload["seed"] for r in (ROOT, *LATER)]
    assert len(set(seeds)) == len(seeds), seeds


@pytest.mark.parametrize("root", PLANS)
def test_every_set_has_a_prediction_for_every_tier_and_metric(root: Path) -> None:
    plan = preregister.load_plan(preregister.plan_path(root))
    for name in plan.sets:
        table = pd.read_csv(root / name / preregister.PREDICTIONS)
        pairs = set(zip(table.tier, table.metric, strict=True))
        assert pairs == {(t, m) for t in plan.tiers for m in validate.METRICS}, name
        assert table.predicted.notna().sum() > len(plan.tiers) * 5, name


@pytest.mark.parametrize("root", PLANS)
def test_recorded_runs_started_after_their_predictions_were_committed(root: Path) -> None:
    table = preregister.protocol_table(preregister.load_plan(preregister.plan_path(root)), root,
                                       drift=False)
    recorded = table[table.recorded_utc.notna()]
    assert len(recorded), "no pre-registered set is recorded"
    late = recorded[~recorded.predicted_first]
    assert late.empty, late.to_string()


@pytest.mark.parametrize("root", PLANS)
def test_a_planned_run_is_what_the_live_engine_will_deploy(root: Path) -> None:
    """The twin's prediction reads the same rendered tier and workload digest as the
    recorded run's meta.json."""
    plan = preregister.load_plan(preregister.plan_path(root))
    for name in plan.sets:
        for tier in plan.tiers:
            folder = root / name / tier
            if not (folder / "meta.json").exists():
                continue
            recorded = read_run(folder).meta
            planned = preregister.planned_meta(plan, name, tier,
                                               preregister.set_server(plan, name))
            assert planned["workload_digest"] == recorded["workload_digest"], (name, tier)
            skip = {"port", "lmcache_mp"}  # chosen free at deploy time
            if "device" not in recorded["tier_config"]:  # recorded before tiers carried it
                skip.add("device")
            assert (read_tier_config(planned["tier_config"]).model_dump(exclude=skip)
                    == read_tier_config(recorded["tier_config"]).model_dump(exclude=skip)
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


def test_the_validation_tables_simulation_is_todays_prediction() -> None:
    """Notebook 06 reads the protocol's drift from its validation table instead of
    simulating every set again: the table's `sim` of a recorded run is `predict_set`'s number
    (the eighth draw's lightest set, on its own spec)."""
    folder, suffix = validate.DRAWS[-1]
    root = data_file("live", folder)
    plan = preregister.load_plan(preregister.plan_path(root))
    name = next(iter(plan.sets))
    run = validate.redrawn(name, suffix)
    table, _ = validate.validation_table(
        {run: preregister.held_out_runs(plan, root)[name]},
        load_profile(data_file("servers", "cpu_tiny.yaml")), preregister.draw_profiles())
    read = preregister.todays_predictions(table, plan, suffix).dropna()
    simulated = preregister.predict_set(plan, name).dropna()
    keys = ["set", "tier", "metric"]
    both = read.merge(simulated, on=keys, suffixes=("_read", "_simulated"))
    assert len(both) == len(read) == len(simulated) > 10
    assert both.predicted_read.to_numpy() == pytest.approx(both.predicted_simulated.to_numpy(),
                                                           rel=1e-9)
    drift = preregister.protocol_table(plan, root, today=read)
    assert drift.max_prediction_drift.notna().sum() == len(plan.tiers)  # only the set given
    assert drift.max_prediction_drift.max() < 1e-5


def test_the_fit_hour_table_sets_each_draws_fit_against_the_earlier_ones() -> None:
    """One row per draw fitted on a campaign of its own, in draw order; the fit's speed is
    its campaign's lone decode step, the pooled one the median of the earlier draws' fit
    campaigns (none before the first)."""
    table = preregister.fit_hour_table()
    fitted = [validate.redrawn("held-out", suffix) for folder, suffix in validate.DRAWS
              if preregister.load_plan(data_file("live", folder, "plan.yaml")).fitted_on]
    assert table.draw.tolist() == fitted and len(fitted) >= 5
    assert pd.isna(table.earlier_fits_ms.iloc[0])
    last = table.iloc[-1]
    earlier = table.iloc[:-1].drop_duplicates("fitted_on")
    earlier = earlier[earlier.fitted_on != last.fitted_on]
    assert last.earlier_fits_ms == pytest.approx(earlier.fit_ms.median())
    fit_run = read_run(data_file().parent / last.fitted_on / "small-kv")
    assert last.fit_ms == pytest.approx(validate.lone_decode_step_ms(fit_run))
    assert ((table.runs_min_ms <= table.runs_median_ms)
            & (table.runs_median_ms <= table.runs_max_ms)).all()


def test_prediction_drift_is_measured_against_the_committed_numbers() -> None:
    stored = pd.DataFrame({"tier": ["dram"] * 2, "metric": ["a", "b"],
                           "predicted": [1.0, 0.0]})
    today = stored.assign(predicted=[1.1, 0.5])
    assert preregister._drift(stored, today, "dram") == pytest.approx(0.5)
    assert preregister._drift(stored, stored, "dram") == 0.0
    assert preregister._drift(stored, today, "dram", ["b"]) == pytest.approx(0.1)  # redefined


def test_a_metric_redefined_after_a_commit_is_named_for_it_and_not_before() -> None:
    (metric, (since, _)), = validate.REDEFINED_METRICS.items()
    assert validate.redefined_since(since - timedelta(seconds=1)) == [metric]
    assert validate.redefined_since(since + timedelta(seconds=1)) == []
    assert validate.redefined_since(None) == [metric]  # never committed: nothing vouches


def test_committed_predictions_are_scored_under_each_plans_run_names(tmp_path: Path) -> None:
    """A later draw's predictions score the rows named `redrawn(set, suffix)`, not another
    draw's."""
    values = [2.0 ** i for i in range(len(validate.DRAWS))]
    for (folder, _), value in zip(validate.DRAWS, values, strict=True):
        (tmp_path / folder / "a-seed-rate").mkdir(parents=True)
        shutil.copy(data_file("live", folder, "plan.yaml"), tmp_path / folder / "plan.yaml")
        pd.DataFrame({"set": ["a-seed-rate"], "tier": ["dram"], "metric": ["ttft_median_s"],
                      "predicted": [value]}).to_csv(
            tmp_path / folder / "a-seed-rate" / preregister.PREDICTIONS, index=False)
    runs = [validate.redrawn("a-seed-rate", suffix) for _, suffix in validate.DRAWS]
    table = pd.DataFrame({"run": runs + ["fit"], "tier": "dram", "metric": "ttft_median_s",
                          "live": 1.0})
    out = preregister.with_predictions(table, tmp_path)
    n = len(values)
    assert out.predicted.tolist()[:n] == values and pd.isna(out.predicted.iloc[n])
    assert out.predicted_error.tolist()[:n] == pytest.approx([100 * (v - 1) for v in values])
