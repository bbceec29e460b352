"""The host CPU each serving process spends per unit of its work (kvrepro.analysis.cpu_demand),
regressed on a live run's process accounting."""

from __future__ import annotations

import gzip

import numpy as np
import pandas as pd
import pytest

from kvrepro._paths import data_dir
from kvrepro.analysis.cpu_demand import (
    ROLE_UNITS,
    fit_cpu_demand,
    predicted_cpu_s,
    stack_profile,
    work_intervals,
)

TRUE_API = {"seconds": 0.01, "requests": 0.004, "prompt_tokens": 2e-6, "output_tokens": 5e-4}


def _samples(seed: int, n: int = 120) -> pd.DataFrame:
    """Cumulative counters of a made-up run whose API server spends exactly TRUE_API."""
    rng = np.random.default_rng(seed)
    work = pd.DataFrame({"time_s": np.arange(n) * 2.0,
                         "requests_finished_stop": rng.poisson(3, n).cumsum(),
                         "prompt_tokens": rng.poisson(9000, n).cumsum(),
                         "generation_tokens": rng.poisson(60, n).cumsum()})
    cpu = (TRUE_API["seconds"] * work["time_s"]
           + TRUE_API["requests"] * work["requests_finished_stop"]
           + TRUE_API["prompt_tokens"] * work["prompt_tokens"]
           + TRUE_API["output_tokens"] * work["generation_tokens"])
    return work.assign(proc_api_server_cpu_user_s=0.8 * cpu,
                       proc_api_server_cpu_system_s=0.2 * cpu)


def test_the_regression_recovers_a_known_demand() -> None:
    intervals = pd.concat([work_intervals(_samples(s), f"run{s}") for s in (0, 1)])
    demand, fit = fit_cpu_demand(intervals)
    got = demand.set_index("unit")["cpu_s_per_unit"]
    for unit, value in TRUE_API.items():
        assert got[unit] == pytest.approx(value, rel=1e-6)
    assert fit.set_index("role").at["api_server", "r2"] == pytest.approx(1.0)
    checked = predicted_cpu_s(intervals, demand)
    assert np.allclose(checked["cpu_api_server_s_predicted"], checked["cpu_api_server_s"])


def test_work_a_unit_does_not_cost_moves_its_coefficient() -> None:
    """The guard: the CPU recorded without the output tokens' share is not fitted as if it
    had it."""
    samples = _samples(0)
    samples["proc_api_server_cpu_user_s"] -= 0.8 * TRUE_API["output_tokens"] * samples[
        "generation_tokens"]
    samples["proc_api_server_cpu_system_s"] -= 0.2 * TRUE_API["output_tokens"] * samples[
        "generation_tokens"]
    demand, _ = fit_cpu_demand(work_intervals(samples))
    assert demand.set_index("unit").at["output_tokens", "cpu_s_per_unit"] == pytest.approx(
        0.0, abs=1e-9)


def test_windows_sum_the_intervals_they_hold() -> None:
    """A window runs from one boundary sample to the next: its work is the counters'
    increase between them, none lost at the start."""
    samples = _samples(0)  # a sample every 2 s, so a window of 10 s holds five intervals
    coarse = work_intervals(samples, window_s=10.0)
    assert coarse["seconds"].eq(10.0).all()
    last_boundary = samples[samples["time_s"] == 10.0 * len(coarse)].iloc[0]
    assert coarse["requests"].sum() == last_boundary["requests_finished_stop"] - samples[
        "requests_finished_stop"].iloc[0]


def test_the_fit_runs_give_a_demand_per_role_with_its_residuals() -> None:
    """The shipped fit campaign (three LMCache tiers of the tiny server, 300 s each): every
    role the issue names gets its units, and the residuals are shown, not hidden."""
    runs = sorted((data_dir() / "live" / "cpu_tiny_fit").glob("*/samples.jsonl"))
    assert runs
    intervals = pd.concat([work_intervals(pd.read_json(p, lines=True), p.parent.name, 10.0)
                           for p in runs])
    demand, fit = fit_cpu_demand(intervals)
    assert set(fit["role"]) == set(ROLE_UNITS)
    assert {(r, u) for r, us in ROLE_UNITS.items() for u in us} == set(
        zip(demand["role"], demand["unit"], strict=True))
    per_token = demand.set_index(["role", "unit"])["cpu_s_per_unit"]
    assert per_token["api_server", "output_tokens"] > 0  # streaming costs the API server
    assert per_token["lmcache_server", "chunks_moved"] > 0
    assert fit["r2"].between(0, 1).all() and fit["median_abs_residual_share"].gt(0).all()


def test_sampled_stacks_tell_polling_from_work(tmp_path) -> None:
    raw = tmp_path / "stacks.txt"
    raw.write_text(
        "run (core.py:1);MessageQueue.acquire_read (vllm/shm_broadcast.py:864);"
        "sched_yield (vllm/distributed/utils.py:46) 300\n"
        "run (core.py:1);SpinCondition.wait (vllm/shm_broadcast.py:208) 100\n"
        "run (core.py:1);forward (model.py:9);OpOverloadPacket.__call__ (torch/_ops.py:1279) 50\n"
        "run (core.py:1);MessageQueue.enqueue (vllm/shm_broadcast.py:956);"
        "Socket.send (zmq/sugar/socket.py:713) 20\n")
    got = stack_profile(raw, rate_hz=100)
    assert got == pytest.approx({"active_s": 4.7, "polling_s": 4.0, "forward_s": 0.5,
                                 "work_s": 0.7})  # the writer's send is work
    packed = tmp_path / "stacks.txt.gz"
    packed.write_bytes(gzip.compress(raw.read_bytes()))
    assert stack_profile(packed, rate_hz=100) == got


def test_the_shipped_profile_shows_the_engine_core_mostly_polling() -> None:
    """The fit load's stacks (data/live/cpu_tiny_host_profile): why the engine core's
    accounting is not its demand."""
    stacks = data_dir() / "live" / "cpu_tiny_host_profile" / "stacks"
    core = stack_profile(stacks / "small-kv-engine_core.txt.gz", rate_hz=100)
    assert core["polling_s"] > 3 * core["work_s"] > 0
