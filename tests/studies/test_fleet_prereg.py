"""Pre-registered live fleet runs (kvrepro.studies.fleet_prereg): predictions first."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from kvrepro._paths import data_dir
from kvrepro.analysis.fleet_live import fleet_live_summary
from kvrepro.studies import fleet_prereg
from kvrepro.studies.fleet_study import twin_of_live_fleet

PLAN = data_dir() / "live" / "cpu_tiny_fleet_host" / "plan.yaml"


def _small_plan(tmp_path: Path) -> Path:
    """The shipped plan cut to one run per campaign, 60 s."""
    text = PLAN.read_text().replace("duration_s: 210", "duration_s: 60")
    plan = fleet_prereg.load_plan(PLAN)
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    small = fleet_prereg.load_plan(path)
    assert set(small.campaigns) == set(plan.campaigns)
    return path


def test_a_planned_run_is_predicted_as_the_twin_of_its_recording() -> None:
    """The 20 sessions / min shared-pool run planned is the one recorded before (same fleet,
    workload, window): the twin predicts the same rows from the plan as from that run."""
    plan = fleet_prereg.load_plan(PLAN)
    run = plan.campaigns["rate20"][0]
    planned = fleet_prereg.predict_run(plan, run)
    recorded = data_dir() / "live" / "cpu_tiny_fleet" / f"{run.kv_pool}-{run.tier}-{run.routing}"
    twin = fleet_live_summary(twin_of_live_fleet(recorded)).drop(columns="router")
    pd.testing.assert_frame_equal(planned.reset_index(drop=True), twin.reset_index(drop=True))


def test_predictions_are_written_per_campaign_and_refused_once_recorded(tmp_path: Path) -> None:
    path = _small_plan(tmp_path)
    written = fleet_prereg.write_predictions(path)
    assert sorted(p.parent.name for p in written) == ["rate20", "rate6"]
    table = pd.read_csv(tmp_path / "rate6" / "predictions.csv")
    assert list(table.instance.astype(str)) == ["0", "1", "total"]
    protocol = fleet_prereg.protocol_table(path)
    assert not protocol.predicted_first.any()  # nothing recorded (nor committed) yet
    assert (protocol.max_prediction_drift < 1e-5).all()  # the twin that wrote them (6 digits)
    moved = tmp_path / "rate6" / "predictions.csv"
    table.assign(ttft_median_s=table.ttft_median_s * 1.5).to_csv(moved, index=False)
    drift = fleet_prereg.protocol_table(path).groupby("campaign").max_prediction_drift.max()
    assert drift["rate6"] == pytest.approx(1 / 3, rel=1e-3) and drift["rate20"] < 1e-5
    run = tmp_path / "rate6" / "shared-dram-round_robin"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"started_utc": "2026-12-04T00:00:00+00:00"}))
    with pytest.raises(ValueError, match="recorded already"):
        fleet_prereg.write_predictions(path)


def test_a_bad_plan_names_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    shutil.copyfile(PLAN, path)
    path.write_text(path.read_text().replace("duration_s: 210", "duration_seconds: 210"))
    with pytest.raises(ValueError, match=r"plan.yaml.*duration"):
        fleet_prereg.load_plan(path)
    assert fleet_prereg.main(["check", str(path)]) == 2


def test_the_recorded_runs_started_after_their_predictions_were_committed() -> None:
    """The shipped campaign: each run's start (its first vLLM log line, the runs recorded
    before fleet metas carried started_utc) after the commit of its predictions."""
    run = PLAN.parent / "rate6" / "shared-dram-round_robin"
    assert str(fleet_prereg.run_start(run, 2026)) == "2026-12-05 00:31:56+00:00"
    table = fleet_prereg.protocol_table(PLAN)
    assert len(table) == 8 and table.predicted_first.all(), table


def test_the_recorded_fleet_accounts_every_process() -> None:
    from kvrepro.analysis.fleet_live import fleet_process_cpu

    cpu = fleet_process_cpu(PLAN.parent / "rate6" / "shared-dram-round_robin")
    roles = cpu.groupby("instance")["role"].apply(set)
    assert roles[-1] >= {"router", "client", "lmcache_server"}
    for instance in (0, 1):
        assert roles[instance] >= {"api_server", "engine_core", "worker"}
    assert (cpu.cpu_busy >= 0).all() and cpu.cpu_busy.sum() < 2.0  # two CPUs
    assert cpu.runqueue_wait_per_s.isna().all()  # recorded before the accounting had it


def test_the_diagnostic_fleet_run_has_every_process_run_queue_wait() -> None:
    from kvrepro.analysis.fleet_live import fleet_process_cpu

    cpu = fleet_process_cpu(PLAN.parents[1] / "cpu_tiny_fleet_wait")
    judged = cpu[cpu.role != "other"]
    assert judged.runqueue_wait_per_s.notna().all(), judged
    # a second of waiting per second at most per main thread
    assert ((judged.runqueue_wait_per_s >= 0) & (judged.runqueue_wait_per_s < 1.0)).all()


ONE_SESSION = data_dir() / "live" / "cpu_tiny_fleet_one_session_prereg" / "plan.yaml"


def test_the_one_session_runs_repeat_the_plans_commands_and_came_after_their_predictions(
        ) -> None:
    """The runs recorded with every server in one session are runs of the earlier plan
    (same fleet, workload and window), and each started after its predictions' commit."""
    again, earlier = (fleet_prereg.load_plan(p) for p in (ONE_SESSION, PLAN))
    assert again.model_dump(exclude={"campaigns"}) == earlier.model_dump(exclude={"campaigns"})
    for campaign, runs in again.campaigns.items():
        assert all(run in earlier.campaigns[campaign] for run in runs), campaign
    table = fleet_prereg.protocol_table(ONE_SESSION)
    assert len(table) == 2 and table.predicted_first.all(), table


def _wait_per_slice_s(samples: list[dict], role: str, instance: int) -> float:
    own = [s for s in samples if s.get("instance") == instance
           and s.get(f"proc_{role}_runqueue_slices") is not None]
    first, last = own[0], own[-1]
    return ((last[f"proc_{role}_runqueue_wait_s"] - first[f"proc_{role}_runqueue_wait_s"])
            / (last[f"proc_{role}_runqueue_slices"] - first[f"proc_{role}_runqueue_slices"]))


def test_session_waits_show_the_autogroups_cost_on_the_same_fleet_run() -> None:
    """The diagnostic run with the servers in sessions of their own and in one: the API
    servers' wait per timeslice (the reference reads the samples) and the one-burst answers
    fall, TTFT is the fleet summary's."""
    from kvrepro.studies.fleet_study import session_waits

    run = "shared-dram-round_robin"
    apart, together = (data_dir() / "live" / name / run for name in (
        "cpu_tiny_fleet_slices", "cpu_tiny_fleet_one_session"))
    table = session_waits({"apart": apart, "together": together})
    for name, path in (("apart", apart), ("together", together)):
        samples = [json.loads(line) for line in (path / "samples.jsonl").open()]
        expected = sum(_wait_per_slice_s(samples, "api_server", i) for i in (0, 1)) / 2
        assert table.loc[name, "api_server_wait_per_slice_ms"] == pytest.approx(1e3 * expected)
        total = fleet_live_summary(path).set_index("instance").loc["total"]
        assert table.loc[name, "ttft_p90_s"] == total["ttft_p90_s"]
    assert (table.loc["apart", "api_server_wait_per_slice_ms"]
            > 10 * table.loc["together", "api_server_wait_per_slice_ms"])
    assert table.loc["apart", "burst_share"] > 0.1 > 0.01 > table.loc["together", "burst_share"]


def test_a_fleet_run_recorded_twice_is_scored_as_the_twin_is() -> None:
    """`replicate_fleet_score`: a recording against itself is within 0 % on every row; the
    session-affinity run recorded twice 32 minutes apart is not (the live spread notebook 13
    sets beside the twin's score); two different commands are refused, naming both."""
    from kvrepro.studies.fleet_study import replicate_fleet_score, ttft_score

    run = "shared-dram-session_affinity"
    first, again = (data_dir() / "live" / name / "rate20" / run for name in (
        "cpu_tiny_fleet_one_session_rest", "cpu_tiny_fleet_ring_prereg"))
    itself = replicate_fleet_score(first, first)
    assert (itself["error"].dropna() == 0).all()
    assert ttft_score(itself)["within"] == ttft_score(itself)["n"] == 6
    twice = ttft_score(replicate_fleet_score(first, again))
    assert twice["n"] == 6 and twice["within"] < 6
    other = data_dir() / "live" / "cpu_tiny_fleet_ring_prereg" / "rate20" / (
        "private-dram-session_affinity")
    with pytest.raises(ValueError, match="not the same command") as err:
        replicate_fleet_score(first, other)
    assert str(first) in str(err.value) and str(other) in str(err.value)
