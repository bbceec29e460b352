"""Sweeps on Ray (kvrepro.sweep, `kvrepro sweep`): one row per point, resumable, failures kept;
and the studies' what-if point functions it runs (kvrepro.studies.whatif).

One local Ray session (2 CPUs) is shared by the module: `run_sweep` uses a running session
as it is, so Ray starts once. The point functions here are cheap and count their calls with
one file per call in a folder named by the point (`log_dir`), so a test sees exactly which
points ran again.
"""

from __future__ import annotations

import importlib
import itertools
import os
import subprocess
import sys
import types
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvrepro import cli
from kvrepro.studies.study_a import STUDY_A_PAUSE
from kvrepro.studies.whatif import (
    DEFAULT_POINT_FUNCTION,
    configuration_cost,
    default_point,
    point_setup,
    whatif_grid,
    whatif_point,
    whatif_setup,
    whatif_table,
)
from kvrepro.sweep import (
    expand_grid,
    load_grid,
    pareto_front,
    point_id,
    read_sweep,
    run_sweep,
    sweep_folder,
)

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_session():
    from kvrepro.sweep import _loopback_node

    with _loopback_node():  # the tests' own Ray listens on the loopback only, as a sweep's
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _log_call(point: dict) -> None:
    Path(point["log_dir"], f"{point_id(point)}-{uuid.uuid4().hex}").write_text("")


def counting_point(point: dict) -> dict:
    """A cheap point: a number that depends on the parameters, and the worker's pid."""
    _log_call(point)
    if point.get("fail_on") == point["a"]:
        raise RuntimeError(f"point a={point['a']} refuses")
    return {"value": point["a"] * 10 + len(point["b"]), "pid": os.getpid()}


def other_point(point: dict) -> dict:
    return {"value": 0}


def _calls(log_dir: Path) -> list[str]:
    """The point ids of every call, one per file."""
    return sorted(p.name.split("-")[0] for p in log_dir.iterdir())


def _grid(log_dir: Path, **extra) -> dict:
    return {"a": [1, 2, 3], "b": ["x", "yy"], "log_dir": [str(log_dir)],
            **{k: [v] for k, v in extra.items()}}


def test_one_row_per_point_with_its_parameters(ray_session, tmp_path):
    log_dir = tmp_path / "calls"
    log_dir.mkdir()
    table = run_sweep(_grid(log_dir), tmp_path / "sweep", point_fn=counting_point,
                      progress=False)
    assert len(table) == 6 and set(table.status) == {"ok"}
    assert set(zip(table.a, table.b, strict=True)) == set(itertools.product([1, 2, 3],
                                                                           ["x", "yy"]))
    assert (table.value == table.a * 10 + table.b.str.len()).all()
    assert not (table.pid == os.getpid()).any(), "points must run in Ray workers"
    assert len(_calls(log_dir)) == 6 and table.attrs["ran"] == 6
    assert sorted(p.stem for p in (tmp_path / "sweep/points").glob("*.parquet")) == sorted(
        table.point_id)
    on_disk = pd.read_parquet(tmp_path / "sweep/sweep.parquet")
    pd.testing.assert_frame_equal(on_disk, read_sweep(tmp_path / "sweep"))


def test_a_resumed_sweep_runs_only_the_missing_points(ray_session, tmp_path):
    log_dir = tmp_path / "calls"
    log_dir.mkdir()
    out = tmp_path / "sweep"
    first = run_sweep(_grid(log_dir), out, point_fn=counting_point, progress=False)
    lost = list(first.point_id[[1, 4]])
    for key in lost:
        (out / "points" / f"{key}.parquet").unlink()
    assert len(read_sweep(out)) == 4
    again = run_sweep(_grid(log_dir), out, point_fn=counting_point, progress=False)
    calls = Counter(_calls(log_dir))
    assert sum(calls.values()) == 8
    assert {key for key, n in calls.items() if n == 2} == set(lost)
    assert (again.attrs["skipped"], again.attrs["ran"]) == (4, 2)
    assert list(again.point_id) == list(first.point_id)
    run_sweep(_grid(log_dir), out, point_fn=counting_point, progress=False)
    assert len(_calls(log_dir)) == 8, "a finished sweep runs nothing again"


def test_a_failing_point_is_recorded_and_the_rest_finish(ray_session, tmp_path):
    log_dir = tmp_path / "calls"
    log_dir.mkdir()
    out = tmp_path / "sweep"
    table = run_sweep(_grid(log_dir, fail_on=2), out, point_fn=counting_point, progress=False)
    failed = table[table.status == "failed"]
    assert sorted(failed.a) == [2, 2] and table.attrs["failed"] == 2
    assert failed.error.str.contains("RuntimeError: point a=2 refuses").all()
    assert failed.value.isna().all()
    assert (table[table.status == "ok"].value.notna()).sum() == 4
    run_sweep(_grid(log_dir, fail_on=2), out, point_fn=counting_point, progress=False)
    assert len(_calls(log_dir)) == 6, "a failed point is finished: not run again by default"
    run_sweep(_grid(log_dir, fail_on=2), out, point_fn=counting_point, progress=False,
              retry_failed=True)
    assert len(_calls(log_dir)) == 8


def test_another_point_function_or_grid_on_a_folder_is_an_error(ray_session, tmp_path):
    log_dir = tmp_path / "calls"
    log_dir.mkdir()
    out = tmp_path / "sweep"
    run_sweep(_grid(log_dir), out, point_fn=counting_point, progress=False)
    with pytest.raises(ValueError, match=f"{out}.*point_function.*other_point"):
        run_sweep(_grid(log_dir), out, point_fn=other_point, progress=False)
    bigger = {**_grid(log_dir), "a": [1, 2, 3, 4]}
    with pytest.raises(ValueError, match=f"{out}.*another grid.*2 of this grid's are new"):
        run_sweep(bigger, out, point_fn=counting_point, progress=False)
    assert len(_calls(log_dir)) == 6


class _InterruptedRay:
    """A stand-in Ray whose wait is interrupted (Ctrl-C), to see what run_sweep cleans up."""

    def __init__(self):
        self.calls = []

    def is_initialized(self):
        return False

    def init(self, **options):
        self.calls.append(("init", options))

    def remote(self, **options):
        return lambda fn: types.SimpleNamespace(remote=lambda *args: object())

    def put(self, value):
        return value

    def cluster_resources(self):
        return {"CPU": 2.0}

    def wait(self, refs, num_returns):
        raise KeyboardInterrupt

    def cancel(self, ref, force):
        self.calls.append(("cancel", force))

    def shutdown(self):
        self.calls.append(("shutdown", None))


def test_ray_it_started_is_shut_down_on_an_interrupt(tmp_path, monkeypatch):
    fake = _InterruptedRay()
    monkeypatch.setattr("kvrepro.sweep._import_ray", lambda: fake)
    with pytest.raises(KeyboardInterrupt):
        run_sweep({"a": [1, 2, 3]}, tmp_path / "sweep", point_fn=other_point, max_parallel=2,
                  progress=False)
    names = [name for name, _ in fake.calls]
    assert names == ["init", "cancel", "cancel", "shutdown"]
    assert fake.calls[0][1]["num_cpus"] == 2


def test_point_ids_are_stable_and_points_distinct():
    assert point_id({"a": 1, "b": "x"}) == point_id({"b": "x", "a": 1})
    assert point_id({"a": 1}) != point_id({"a": 1.5})
    code = "from kvrepro.sweep import point_id; print(point_id({'b': 'x', 'a': 1}))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": "123"}, check=True)
    assert other.stdout.strip() == point_id({"a": 1, "b": "x"}), "same key in every session"
    with pytest.raises(ValueError, match="points 0 and 1 are the same"):
        expand_grid([{"a": 1}, {"a": 1}])
    with pytest.raises(ValueError, match="parameter 'a' must be a number"):
        expand_grid([{"a": [1, 2]}])


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    return path


DEFAULT_FN = f"point_function: {DEFAULT_POINT_FUNCTION}\n"


@pytest.mark.parametrize("text, message", [
    (DEFAULT_FN + "gird: {a: [1]}\n", r"key gird: Extra inputs"),
    (DEFAULT_FN + "grid: {dram_gb: 5}\n", r"key grid\.dram_gb: Input should be a valid list"),
    ("grid: {a: [1]}\n", r"key point_function: Field required"),
    (DEFAULT_FN + "fixed: {server: study_a, tier: dram}\ngrid: {dram_gbb: [1]}\n",
     r"point 0: unknown parameter 'dram_gbb'"),
    (DEFAULT_FN + "fixed: {server: study_a, tier: dram, dram_gb: 1}\ngrid: {dram_gb: [1]}\n",
     r"parameter\(s\) \['dram_gb'\] are also in 'fixed'"),
    (DEFAULT_FN + "fixed: {server: study_a, tier: dram}\ngrid: {session_rate_per_min: [-1]}\n",
     r"point 0: parameter .session_rate_per_min.: Input should be greater than 0"),
    (DEFAULT_FN + "fixed: {server: cpu_tiny, tier: dram, duration_s: 60.0}\n"
     "points: [{seed: 1}]\n",
     r"point 0: parameter 'warmup_s' \(180 s\) must be below 'duration_s'"),
    ("point_function: kvrepro.sweep:nothing\npoints: [{a: 1}]\n", r"nothing.*not found"),
])
def test_grid_file_errors_name_the_file_and_key(tmp_path, text, message):
    """Errors name the file and the key; a grid names its point function (the runner has
    none of its own: what a point means is the caller's)."""
    path = _write(tmp_path, text)
    with pytest.raises(ValueError, match=message) as err:
        load_grid(path)
    assert str(path) in str(err.value)


def test_shipped_grid_has_48_distinct_valid_points():
    points, fn, spec = load_grid(Path(__file__).parents[1] / "data/sweeps/whatif_48.yaml")
    assert len(points) >= 48 and fn is default_point
    assert spec.point_function == DEFAULT_POINT_FUNCTION
    assert len({point_id(p) for p in points}) == len(points)
    by_name, _, _ = load_grid("whatif_48")
    assert by_name == points


def test_cli_sweep_writes_the_table_and_rejects_a_bad_grid(ray_session, tmp_path, capsys):
    log_dir = tmp_path / "calls"
    log_dir.mkdir()
    good = _write(tmp_path, "point_function: tests.test_sweep:counting_point\n"
                  f"fixed: {{log_dir: '{log_dir}', b: x}}\ngrid: {{a: [1, 2]}}\n")
    assert cli.main(["sweep", str(good), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    assert list(pd.read_parquet(tmp_path / "out/sweep.parquet").value) == [11, 21]
    assert "2 points" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("point_function: tests.test_sweep:counting_point\ngrid: {a: 1}\n")
    assert cli.main(["sweep", str(bad), "--out", str(tmp_path / "out2")]) == 2
    assert f"{bad}: invalid sweep grid: key grid.a" in capsys.readouterr().err


def test_default_point_runs_the_twins_through_ray_and_prices_them(ray_session, tmp_path):
    short = {"server": "cpu_tiny", "tier": "dram", "session_rate_per_min": 20.0,
             "duration_s": 90.0, "warmup_s": 10.0}
    points = [{**short, "dram_gb": 0.05}, {**short, "dram_gb": 0.5},
              {**short, "dram_gb": 0.5, "n_servers": 2, "routing": "round_robin",
               "kv_pool": "shared"}]
    table = run_sweep(points, tmp_path / "sweep", point_fn=default_point, progress=False)
    assert list(table.status) == ["ok"] * 3, table.error.tolist()
    for column in ("throughput_tok_s", "ttft_median_s", "ttft_p90_s", "cached_share_gpu",
                   "cached_share_dram", "usd_per_h", "tok_per_usd"):
        assert (table[column] > 0).all(), column
    assert (table.ttft_p90_s >= table.ttft_median_s).all()
    assert np.allclose(table.tok_per_usd, table.throughput_tok_s * 3600 / table.usd_per_h)
    one, big, fleet = (table.iloc[i] for i in range(3))
    assert big.usd_per_h > one.usd_per_h, "more DRAM costs more"
    assert one.dram_peak_bytes_used <= 0.05e9 < big.dram_capacity_bytes
    assert np.allclose(table.cached_share, table.cached_share_gpu + table.cached_share_dram)
    assert (fleet.n_servers, one.n_servers) == (2, 1)
    assert fleet.routed_away_share > 0 and one.routed_away_share == 0
    assert fleet.throughput_per_server_tok_s == pytest.approx(fleet.throughput_tok_s / 2)


def test_a_fleet_point_goes_to_the_fleet_twin(monkeypatch):
    """The hook, with a stand-in fleet twin: a point with n_servers/routing calls
    `simulate_fleet` with its fleet, overrides and window, and returns the twin's headlines
    priced for n servers."""
    seen = {}

    def simulate_fleet(workload, fleet, **options):
        seen.update(fleet=fleet, workload=workload, **options)
        return types.SimpleNamespace(stats={"unfinished": 2})

    fake = types.ModuleType("kvrepro.engines.sim.fleet")
    fake.simulate_fleet = simulate_fleet
    fake.fleet_headlines = lambda result: {"throughput_tok_s": 3000.0, "seen": result.stats}
    monkeypatch.setitem(sys.modules, "kvrepro.engines.sim.fleet", fake)
    monkeypatch.setattr(importlib.import_module("kvrepro.engines.sim"), "fleet", fake,
                        raising=False)
    point = {"server": "cpu_tiny", "tier": "dram", "n_servers": 3, "routing": "round_robin",
             "kv_pool": "private", "dram_gb": 0.25, "session_rate_per_min": 20.0,
             "duration_s": 60.0, "warmup_s": 5.0, "max_in_flight": 7}
    out = default_point(point)
    assert (seen["fleet"].n_servers, seen["fleet"].routing) == (3, "round_robin")
    assert seen["profile_overrides"] == {"dram_gb": 0.25}
    assert (seen["warmup_s"], seen["max_in_flight"]) == (5.0, 7)
    assert seen["workload"].spec["params"]["session_rate_per_min"] == 20.0
    assert (out["seen"], out["unfinished_requests"]) == ({"unfinished": 2}, 2.0)
    one = configuration_cost(point_setup({**point, "n_servers": 1}), 1.0)
    assert out["usd_per_h"] == pytest.approx(3 * one["usd_per_h"])
    assert out["tok_per_usd"] == pytest.approx(3000.0 * 3600 / out["usd_per_h"])


def test_point_parameters_reach_the_specs_they_name():
    setup = point_setup({"server": "study_a", "tier": "flash", "flash_gb": 2000,
                         "server.engine.max_num_seqs": 31, "workload.p_returning": 0.2,
                         "workload.pause": "study_a", "session_rate_per_min": 4.0,
                         "routing": "prefix_aware", "prefix_aware.cache_threshold": 0.7,
                         "bill.gpus": 2, "price.dram_usd_per_gb": 7.0, "max_in_flight": 9})
    assert setup.spec.tier("flash").stores[-1].capacity_bytes == 2000e9
    assert setup.spec.engine.max_num_seqs == 31 and setup.is_fleet
    assert (setup.workload.p_returning, setup.workload.session_rate_per_min) == (0.2, 4.0)
    assert setup.workload.pause.model_dump(include=set(STUDY_A_PAUSE)) == STUDY_A_PAUSE
    assert setup.fleet.prefix_aware.cache_threshold == 0.7 and setup.fleet.n_servers == 1
    assert (setup.bill.gpus, setup.prices.dram_usd_per_gb, setup.max_in_flight) == (2, 7.0, 9)
    assert not point_setup({"server": "study_a", "tier": "dram"}).is_fleet


def test_a_shared_pool_buys_the_tier_once_scaled():
    base = {"server": "study_a", "tier": "flash", "n_servers": 8}
    private = configuration_cost(point_setup({**base, "kv_pool": "private"}), 1e4)
    shared = configuration_cost(point_setup({**base, "kv_pool": "shared",
                                             "shared_pool.capacity_scale": 2.0}), 1e4)
    assert private["tier_usd_per_h"] == pytest.approx(4 * shared["tier_usd_per_h"])
    assert private["usd_per_h"] - shared["usd_per_h"] == pytest.approx(
        6 * shared["tier_usd_per_h"] / 2)


def _dominated_brute_force(xs: np.ndarray, ys: np.ndarray, i: int) -> bool:
    return any(xs[j] >= xs[i] and ys[j] <= ys[i] and (xs[j] > xs[i] or ys[j] < ys[i])
               for j in range(len(xs)))


@pytest.mark.parametrize("seed", range(5))
def test_pareto_front_matches_a_brute_force_check(seed):
    rng = np.random.default_rng(seed)
    n = 60
    table = pd.DataFrame({"tok_per_usd": rng.integers(0, 12, n).astype(float),
                          "ttft_p90_s": rng.integers(0, 12, n).astype(float),
                          "status": np.where(rng.random(n) < 0.1, "failed", "ok")})
    table.loc[3, "ttft_p90_s"] = np.nan
    front = pareto_front(table, "tok_per_usd", "ttft_p90_s")
    ok = table[(table.status == "ok") & table.ttft_p90_s.notna()]
    xs, ys = ok.tok_per_usd.to_numpy(), ok.ttft_p90_s.to_numpy()
    expected = {ok.index[i] for i in range(len(ok)) if not _dominated_brute_force(xs, ys, i)}
    assert set(front.index) == expected and expected
    assert front.tok_per_usd.is_monotonic_increasing


# ---------------------------------------------------------------- the what-if point (notebook 07)

def _direct_whatif(dram_gb: float, rate: float, run_s: float, warmup_s: float, bin_s: float,
                   smooth_bins: int) -> dict:
    """The what-if numbers of a cpu_tiny DRAM-tier run, from `simulate` and the analysis'
    curves by hand: the late level is the mean over the bins centred in the last third, the
    fill time the store's first eviction or refusal in the run's stats, TTFT and cached
    share over the requests sent in [warmup_s, run_s) that succeeded."""
    from kvrepro import analysis
    from kvrepro.engines.sim import sim_profile
    from kvrepro.engines.sim.engine import simulate
    from kvrepro.tier_spec import override_server, shipped_server
    from kvrepro.workload import AgenticSpec, generate_agentic

    spec = override_server(shipped_server("cpu_tiny"), {"dram_gb": dram_gb})
    workload = generate_agentic(AgenticSpec(session_rate_per_min=rate, duration_s=run_s,
                                            warmup_s=warmup_s))
    res = simulate(workload, sim_profile(spec), "dram", warmup_s=warmup_s, progress=False)
    rates = analysis.smooth_rates(analysis.throughput_over_time(res.records, bin_s, run_s),
                                  smooth_bins)
    centre_s = (rates.bin_start_s + rates.bin_end_s) / 2
    firsts = [res.stats.get(f"dram_first_{what}_s") for what in ("eviction", "refusal")]
    finite = [float(t) for t in firsts if t is not None and np.isfinite(float(t))]
    rec = res.records
    sent = rec[(rec.error == "") & rec.first_token_s.notna() & (rec.send_s >= warmup_s)
               & (rec.send_s < run_s)]
    return {"peak_tok_s": rates.total_tok_s.max(),
            "late_tok_s": rates[centre_s >= 2 * run_s / 3].total_tok_s.mean(),
            "fill_min": min(finite) / 60 if finite else np.nan,
            "ttft_median_s": sent.ttft_s.median(),
            "cached_share": sent.cached_prompt_tokens.sum() / sent.prompt_tokens.sum()}


def test_whatif_point_on_ray_matches_a_direct_simulation(ray_session, tmp_path):
    base = {"server": "cpu_tiny", "tier": "dram", "session_rate_per_min": 20.0,
            "duration_s": 90.0, "warmup_s": 10.0, "read.bin_s": 10.0, "read.smooth_bins": 3}
    points = [{**base, "dram_gb": 0.05}, {**base, "dram_gb": 0.5}]
    table = run_sweep(points, tmp_path / "sweep", point_fn=whatif_point, progress=False)
    assert list(table.status) == ["ok", "ok"], table.error.tolist()
    for (_, row), point in zip(table.iterrows(), points, strict=True):
        want = _direct_whatif(point["dram_gb"], 20.0, 90.0, 10.0, 10.0, 3)
        for column, value in want.items():
            assert row[column] == pytest.approx(value, nan_ok=True), (point["dram_gb"], column)
        assert row.fill_store == "dram" and row.tok_per_usd > 0
    small = table.iloc[0]
    assert np.isfinite(small.fill_min) and small.fill_min < 1.5, "0.05 GB fills in the run"
    unsmoothed = _direct_whatif(0.05, 20.0, 90.0, 10.0, 10.0, 1)
    assert small.peak_tok_s != pytest.approx(unsmoothed["peak_tok_s"]), "smoothing is read"


def test_whatif_grid_changes_one_knob_per_point(monkeypatch):
    from kvrepro.tier_spec import shipped_server

    points, labels = whatif_grid("study_a", dram_gb=[256, 1024], flash_tb=[0.25, 10],
                                 dram_ttl_s=[300], session_rates_per_min=[1.5, 3.5],
                                 duration_s=1800.0, bin_s=120.0, smooth_bins=3, seed=2)
    assert labels.knob.tolist() == ["DRAM (GB)"] * 2 + ["flash (TB)"] * 2 + [
        "DRAM TTL (min)"] + ["sessions/min (DRAM tier)"] * 2
    assert labels.value.tolist() == ["256", "1024", "0.25", "10", "5", "1.5", "3.5"]
    assert labels.point_id.tolist() == [point_id(p) for p in points]
    base = shipped_server("study_a")
    dram0 = base.tier("dram").stores[0]
    flash0 = base.tier("flash").stores[-1].capacity_bytes
    setups = [whatif_setup(p) for p in points]
    got = [(s.fleet.tier, s.spec.tier("dram").stores[0].capacity_bytes,
            s.spec.tier("flash").stores[-1].capacity_bytes,
            s.spec.tier("dram").stores[0].eviction, s.workload.session_rate_per_min,
            r.fill_store) for s, r in setups]
    assert got == [("dram", 256e9, flash0, dram0.eviction, 2.5, "dram"),
                   ("dram", 1024e9, flash0, dram0.eviction, 2.5, "dram"),
                   ("flash", dram0.capacity_bytes, 0.25e12, dram0.eviction, 2.5, "flash"),
                   ("flash", dram0.capacity_bytes, 10e12, dram0.eviction, 2.5, "flash"),
                   ("dram", dram0.capacity_bytes, flash0, "ttl", 2.5, "dram"),
                   ("dram", dram0.capacity_bytes, flash0, dram0.eviction, 1.5, "dram"),
                   ("dram", dram0.capacity_bytes, flash0, dram0.eviction, 3.5, "dram")]
    assert setups[4][0].spec.tier("dram").stores[0].ttl_s == 300
    for setup, read in setups:
        assert (setup.workload.duration_s, setup.workload.seed) == (1800.0, 2)
        assert setup.workload.pause.model_dump(include=set(STUDY_A_PAUSE)) == STUDY_A_PAUSE
        assert (read.settings.bin_s, read.settings.smooth_bins, read.settings.run_s) == (
            120.0, 3, 1800.0)
    monkeypatch.chdir(Path(__file__).parents[1] / "notebooks")
    by_path, _ = whatif_grid("../data/servers/study_a.yaml", dram_gb=[256], flash_tb=[],
                             dram_ttl_s=[], session_rates_per_min=[], duration_s=1800.0,
                             bin_s=120.0, smooth_bins=3)
    assert by_path[0]["server"] == str((Path.cwd() / "../data/servers/study_a.yaml").resolve())
    with pytest.raises(ValueError, match="are the same point"):
        whatif_grid("study_a", dram_gb=[256, 256], flash_tb=[], dram_ttl_s=[],
                    session_rates_per_min=[], duration_s=1800.0, bin_s=120.0, smooth_bins=3)


@pytest.mark.parametrize("change, message", [
    ({"read.bin_s": 0}, "'read.bin_s' must be a number of seconds > 0"),
    ({"read.smooth_bins": 1.5}, "'read.smooth_bins'.*integer >= 1"),
    ({"read.smooth": "max"}, "'read.smooth'.*one of"),
    ({"read.fill_store": "flash"}, "tier 'dram' has no store 'flash'"),
    ({"read.bins": 3}, r"unknown parameter\(s\) \['read.bins'\]"),
    ({"n_servers": 2}, "reads one server's run"),
])
def test_a_bad_whatif_point_fails_before_the_sweep(tmp_path, change, message):
    point = {"server": "cpu_tiny", "tier": "dram", "duration_s": 90.0, "warmup_s": 10.0,
             **change}
    with pytest.raises(ValueError, match=message):
        run_sweep([point], tmp_path / "sweep", point_fn=whatif_point, progress=False)
    assert not (tmp_path / "sweep" / "points").exists(), "nothing ran"


def test_whatif_table_joins_labels_and_names_failed_points():
    labels = pd.DataFrame({"knob": ["k", "k"], "value": ["1", "2"], "point_id": ["b", "a"]})
    rows = pd.DataFrame({"point_id": ["a", "b"], "status": ["ok", "ok"], "error": ["", ""],
                         "peak_tok_s": [1.0, 2.0]})
    joined = whatif_table(labels, rows)
    assert joined[["value", "peak_tok_s"]].values.tolist() == [["1", 2.0], ["2", 1.0]]
    failed = rows.assign(status=["failed", "ok"], error=["RuntimeError: boom", ""])
    with pytest.raises(RuntimeError, match=r"failed points \['a: RuntimeError: boom'\]"):
        whatif_table(labels, failed)
    with pytest.raises(RuntimeError, match=r"missing points \['a'\]"):
        whatif_table(labels, rows.iloc[1:])


def test_sweep_folder_is_fresh_unless_given(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    first, second = sweep_folder("", tmp_path / "sweeps"), sweep_folder("", tmp_path / "sweeps")
    assert first != second and first.parent == tmp_path / "sweeps"
    assert first.is_dir() and not any(first.iterdir())
    assert sweep_folder(tmp_path / "old") == tmp_path / "old"
    assert sweep_folder("").parent == tmp_path / "tmp"
