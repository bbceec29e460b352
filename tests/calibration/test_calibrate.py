"""The calibration routine (kvrepro.calibration.calibrate, `kvrepro calibrate`) and the
stale-fit guard: every target a plan declares `fitted` lies within its tolerance on the
shipped files (seed 0), and moving a fitted parameter makes the guard fail.

The routine's own tests run a cheap point function of this module on a toy plan (a quadratic
whose minimum is known), so they check the search, the write-back and the resume, not a twin.
"""

from __future__ import annotations

import math
import re
import uuid
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kvrepro import cli
from kvrepro._paths import data_dir
from kvrepro.calibration.calibrate import (
    apply_point,
    calibrate,
    current_values,
    fixed_place,
    load_plan,
    loss,
    outside,
    residual,
)
from kvrepro.studies import provenance, study_a_fit, study_b_fit

PLANS = sorted((data_dir() / "studies").glob("*.yaml"))
SHIPPED_FIT = {"study_a": study_a_fit.shipped_fit, "study_b": study_b_fit.shipped_fit}


# ------------------------------------------------------------------ the stale-fit guard


def _outside(plan: Path, residuals: dict[str, float]) -> dict[str, float]:
    tol = load_plan(plan).calibration.tolerance
    return {t: r for t, r in residuals.items() if not abs(r) <= tol}


@pytest.mark.parametrize("plan", PLANS, ids=[p.stem for p in PLANS])
def test_every_fitted_target_is_within_tolerance_on_the_shipped_files(plan):
    """Within, except exactly the targets the plan declares beyond reach of the stated facts
    (each with why); and the residuals are the ones the routine recorded (the files are its
    output, not edited since)."""
    residuals = SHIPPED_FIT[plan.stem](plan)
    calibration = load_plan(plan).calibration
    assert set(residuals) == set(calibration.targets)
    assert set(_outside(plan, residuals)) == set(calibration.beyond_reach), (
        f"{plan.name}: fitted targets beyond the tolerance (residuals) are not the declared "
        f"ones; a model change broke the fit: refit with `kvrepro calibrate --plan "
        f"data/studies/{plan.name}`")
    recorded = calibration.result["residual_pct"]
    assert {t: round(100 * r, 2) for t, r in residuals.items()} == pytest.approx(
        recorded, abs=0.01)


@pytest.mark.parametrize(("plan", "change", "broken"), [
    ("study_a", {"pause_mean_s": 80.0}, "A2.dram_fill_time"),
    ("study_b", {"ssd_chunk_read_latency_s": 0.0012}, "B6.untuned_low"),
])
def test_the_guard_fails_when_a_fitted_parameter_moves(plan, change, broken):
    path = data_dir() / "studies" / f"{plan}.yaml"
    assert broken in _outside(path, SHIPPED_FIT[plan](path, **change))


def test_the_fitted_kinds_are_the_plans_targets():
    declared = {t for p in PLANS for t in load_plan(p).calibration.targets}
    fitted = {i for i, (kind, _) in provenance.HEADLINE_KINDS.items() if kind == "fitted"}
    assert fitted == declared
    assert provenance.kind_of("A5.resumes")[1].endswith("(data/studies/study_a.yaml)")
    assert provenance.kind_of("A5.normal_ttft_dram")[0] == "predicted"


def test_no_parameter_measured_on_this_machine_sits_in_study_as_server():
    """Study A types no twin rate: they are derived from its GPUs and the shared constants."""
    server = yaml.safe_load((data_dir() / "servers" / "study_a.yaml").read_text())
    assert "twin" not in server and server["hardware"]["gpu"] == "RTX-PRO-6000"


STUDY_A_STATED = [
    "server:model",  # FP8 KV, 126,976 B per token
    "server:hardware.gpu", "server:hardware.constants_arch",
    "server:hardware.disk_reads_in_flight",  # LMCache 0.5.0: hard-coded
    "server:twin.mfu", "server:twin.decode_efficiency",  # shared constants only
    "server:tiers.dram.stores.0.capacity_bytes",  # 512 GB
    "server:tiers.dram.stores.0.read_bw_bytes_s",
    "server:tiers.flash.stores.0.capacity_bytes",  # 64 GB staging
    "server:tiers.flash.stores.1.drives", "server:tiers.flash.stores.1.raid_level",
    "server:tiers.flash.stores.1.read_bw_bytes_s",  # fio 114 GB/s
    "server:tiers.flash.stores.1.chunk_read_latency_s",
    "server:engine.kv_cache_bytes",
    "campaign:workload.session_rate_per_min", "campaign:workload.warmup_s",
    "campaign:workload.tool_tokens", "campaign:workload.context_cap_tokens",
    "campaign:workload.idle_s", "campaign:workload.idle_after_turns",
]


@pytest.mark.parametrize("place", STUDY_A_STATED)
def test_study_as_plan_frees_no_stated_fact(place):
    """Every fact study A states (or its release's source or the shared constants give) is in
    the plan's `fixed` list, and no free parameter sets it."""
    plan = load_plan(data_dir() / "studies" / "study_a.yaml")
    assert fixed_place(plan, place) is not None, place
    assert not [p.name for p in plan.calibration.parameters
                if any(fixed_place(plan, s) for s in p.sets)]


@pytest.mark.parametrize(("place", "value"), [
    ("server:model", "MiniMax-M2.7-FP8-KV-BF16"),
    ("server:tiers.flash.stores.1.read_bw_bytes_s", 7.0e9),
    ("campaign:workload.session_rate_per_min", 3.0),
])
def test_a_plan_that_frees_a_stated_fact_is_refused(tmp_path, place, value):
    """The guard: plant a parameter that sets a fixed place and the plan does not load."""
    src = data_dir() / "studies" / "study_a.yaml"
    body = yaml.safe_load(src.read_text())
    body["server"] = str(data_dir() / "servers" / "study_a.yaml")
    body["calibration"]["parameters"].append(
        {"name": "freed", "sets": [place], "values": [value], "stage": 1,
         "fits": ["A2.dram_fill_time"], "why": "a fit that moves a stated fact"})
    plan = tmp_path / "study_a.yaml"
    plan.write_text(yaml.safe_dump(body))
    with pytest.raises(ValueError, match=re.escape(f"parameter 'freed' sets {place!r}, a "
                                                   "fixed place")):
        load_plan(plan)


# ------------------------------------------------------------------ residuals and plans


def test_residual_of_a_level_and_of_bounds():
    assert residual(11.0, 10.0) == pytest.approx(0.1)
    assert residual(0.5, 1.0, "max") == 0.0 and residual(1.2, 1.0, "max") == pytest.approx(0.2)
    assert residual(12.0, 10.0, "min") == 0.0 and residual(8.0, 10.0, "min") == pytest.approx(-0.2)
    assert residual(math.nan, 1.0) == math.inf


def test_points_rank_by_targets_beyond_tolerance_then_by_loss():
    inside = {"residual_a": 0.09, "residual_b": 0.09}  # loss 0.0162, both within 10 %
    lower = {"residual_a": 0.0, "residual_b": 0.11}    # loss 0.0121, one beyond
    assert loss(lower, ["a", "b"]) < loss(inside, ["a", "b"])
    assert (outside(inside, ["a", "b"], 0.1), outside(lower, ["a", "b"], 0.1)) == (0, 1)
    assert outside({"residual_a": float("nan")}, ["a", "b"], 0.1) == 2


TOY_SERVER = """# the toy server
model: MiniMax-M2.7-FP8-KV-BF16
engine: {kv_cache_bytes: 8.0e+09}
twin:
  fp16_tflops: 100
  mem_bw_tb_s: 1.0
  step_overhead_s: 0.0  # a free number
live: {model: toy/toy}
tiers:
  a:
    stores:
      - {name: s, kind: dram, capacity_bytes: 1.0e+09, read_bw_bytes_s: 1.0e+09,
         write_bw_bytes_s: 1.0e+09}
"""
"""A valid server spec (the write-back checks the spec it writes) with two free places."""


def _toy_plan(tmp_path: Path, **calibration) -> Path:
    server = tmp_path / "server.yaml"
    server.write_text(TOY_SERVER)
    plan = tmp_path / "plan.yaml"
    body = {"server": "server.yaml",
            "point_function": "tests.calibration.test_calibrate:toy_point",
            "campaign": {"log_dir": str(tmp_path / "calls"), "mode": "slow"},
            "calibration": {"targets": {"T.x": "x", "T.bw": "bw and mode"},
                            "parameters": [
                                {"name": "mode", "sets": ["campaign:mode"],
                                 "values": ["slow", "fast"], "stage": 1, "fits": ["T.bw"],
                                 "why": "a choice"},
                                {"name": "x", "sets": ["server:twin.step_overhead_s"],
                                 "values": [0.0, 1.0, 2.0, 3.0], "stage": 2,
                                 "fits": ["T.x"], "why": "a level"},
                                {"name": "bw",
                                 "sets": ["server:tiers.a.stores.0.read_bw_bytes_s"],
                                 "values": [1e9, 2e9, 4e9], "stage": 2, "fits": ["T.bw"],
                                 "why": "a rate"}],
                            **calibration}}
    plan.write_text("# the toy plan\n" + yaml.safe_dump(body, sort_keys=False))
    (tmp_path / "calls").mkdir()
    return plan


def toy_point(point: dict) -> dict:
    """Residuals with a known minimum: x = 2, and bw = 2e9 in the fast mode (4e9 in the
    slow one); logs each call in the plan's campaign log folder."""
    server, campaign = apply_point(point["plan"], point)
    Path(campaign["log_dir"], uuid.uuid4().hex).write_text("")
    x = server["twin"]["step_overhead_s"]
    bw = server["tiers"]["a"]["stores"][0]["read_bw_bytes_s"]
    wanted = 2e9 if campaign["mode"] == "fast" else 4e9
    return {"T.x": x, "T.bw": bw, "residual_T.x": (x - 2.0) / 2.0,
            "residual_T.bw": (bw - wanted) / wanted * 0.1
            + (0.0 if campaign["mode"] == "fast" else 0.3)}


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    from kvrepro.sweep import _loopback_node

    with _loopback_node():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_calibrate_finds_the_minimum_stage_by_stage_and_writes_it_back(ray_session, tmp_path):
    plan = _toy_plan(tmp_path)
    result = calibrate(plan, tmp_path / "runs", progress=False)
    assert result.values == {"mode": "fast", "x": 2.0, "bw": 2e9}
    assert result.residuals == {"T.x": 0.0, "T.bw": 0.0}
    assert len(result.points) == 2 + 12  # stage 1: two modes; stage 2: 4 x 3
    assert current_values(plan) == result.values
    server_text = (tmp_path / "server.yaml").read_text()
    assert server_text.startswith("# the toy server")
    assert "step_overhead_s: 2.0  # fitted (kvrepro calibrate): T.x +0.0 %" in server_text
    assert yaml.safe_load(server_text)["tiers"]["a"]["stores"][0]["read_bw_bytes_s"] == 2e9
    written = load_plan(plan)
    assert written.campaign["mode"] == "fast"
    assert written.calibration.result["residual_pct"] == {"T.x": 0.0, "T.bw": 0.0}
    assert written.calibration.result["points"] == 14
    # what each parameter moves: its ends, the others at the fit (5 more campaigns)
    assert len(list((tmp_path / "calls").iterdir())) == 14 + 5
    assert written.calibration.result["effects"]["x"] == {
        "2.0": {"T.x": 2.0}, "0.0": {"T.x": 0.0}, "3.0": {"T.x": 3.0}}
    assert set(written.calibration.result["effects"]["mode"]) == {"fast", "slow"}


def test_calibrate_resumes_and_a_second_round_starts_from_the_first(ray_session, tmp_path):
    plan = _toy_plan(tmp_path, rounds=2)
    calls = tmp_path / "calls"
    first = calibrate(plan, tmp_path / "runs", progress=False, write=False)
    assert len(list(calls.iterdir())) == 2 * 14 + 5  # two rounds, then the effects
    again = calibrate(plan, tmp_path / "runs", progress=False, write=False)
    assert len(list(calls.iterdir())) == 2 * 14 + 5  # every point was already there
    assert again.values == first.values == {"mode": "fast", "x": 2.0, "bw": 2e9}
    assert set(first.points["round"]) == {1, 2}


@pytest.mark.parametrize(("edit", "message"), [
    ({"sets": ["gpu:twin.x"]}, re.escape("place 'gpu:twin.x'")),
    ({"fits": ["T.nothing"]}, re.escape("fits ['T.nothing']")),
])
def test_a_bad_plan_names_the_file_and_the_parameter(tmp_path, edit, message):
    plan = _toy_plan(tmp_path)
    body = yaml.safe_load(plan.read_text())
    body["calibration"]["parameters"][1].update(edit)
    plan.write_text(yaml.safe_dump(body))
    with pytest.raises(ValueError, match=message) as err:
        load_plan(plan)
    assert str(plan) in str(err.value) and "'x'" in str(err.value)


@pytest.mark.parametrize("plan", PLANS, ids=[p.stem for p in PLANS])
def test_every_shipped_plan_loads_and_its_values_are_candidates(plan):
    values = current_values(plan)
    for param in load_plan(plan).calibration.parameters:
        assert values[param.name] in param.values, param.name


def test_the_cli_finds_a_servers_plan():
    assert cli._plan_for("data/servers/study_a.yaml") == data_dir() / "studies" / "study_a.yaml"
    with pytest.raises(SystemExit, match="no calibration plan"):
        cli._plan_for("data/servers/cpu_tiny.yaml")


def test_reproduce_shows_every_fitted_targets_residual_with_its_rule():
    from kvrepro.studies.fits import fitted_residuals
    from kvrepro.studies.reference import compare

    table = pd.concat([compare({"A2.baseline_plateau": 13_500.0,
                                "A4.dram_ttft_before_fill": 0.4}, source="04_sim_study_a"),
                       compare({"B6.untuned_low": 1.26}, source="05_sim_study_b")])
    fits = fitted_residuals(table).set_index("id")
    declared = {t for p in PLANS for t in load_plan(p).calibration.targets}
    assert set(fits.index) == declared
    assert fits.at["A2.baseline_plateau", "residual_pct"] == pytest.approx(12.5)
    assert not fits.at["A2.baseline_plateau", "within"]
    assert fits.at["A4.dram_ttft_before_fill", "residual_pct"] == 0.0  # inside the 1 s bound
    assert fits.at["B6.untuned_low", "within"]
    assert not fits.at["A5.resumes", "within"]  # not in the table: shown, and not within


def test_the_fit_is_read_from_the_plans_notebook_only():
    from kvrepro.studies.fits import fitted_residuals
    from kvrepro.studies.reference import compare

    table = pd.concat([compare({"A5.resumes": 14.0}, source="02_workload"),
                       compare({"A5.resumes": 10.0}, source="04_sim_study_a")])
    fits = fitted_residuals(table).set_index("id")
    assert fits.at["A5.resumes", "reproduced"] == 10.0


def test_a_target_declared_beyond_reach_must_be_a_target(tmp_path):
    src = data_dir() / "studies" / "study_a.yaml"
    body = yaml.safe_load(src.read_text())
    body["server"] = str(data_dir() / "servers" / "study_a.yaml")
    body["calibration"]["beyond_reach"]["A5.resume_max_flash"] = "not a fitted target"
    plan = tmp_path / "study_a.yaml"
    plan.write_text(yaml.safe_dump(body))
    with pytest.raises(ValueError, match=re.escape("beyond_reach names ['A5.resume_max_flash']")):
        load_plan(plan)
