"""The host CPUs the serving processes share, in the twin (kvrepro.engines.sim.host_cpu):
placement, processor sharing, and what the engine's steps, front end and lookups wait for."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrepro.engines.sim.host_cpu import HostCpu
from kvrepro.tier_spec import HostCpuSpec, Placement

SINGLE = Placement(engine_cpus="0", front_cpus="1", lmcache_cpus="1", client_cpus="1",
                   router_cpus="1")


def _spec(tmp_path: Path, rows: dict[tuple[str, str], float], cpus: int = 2,
          speed: float = 1.0) -> HostCpuSpec:
    path = tmp_path / "demand.csv"
    path.write_text("role,unit,cpu_s_per_unit\n" + "".join(
        f"{role},{unit},{value}\n" for (role, unit), value in rows.items()))
    return HostCpuSpec(cpus=cpus, speed=speed, demand_csv=str(path))


def _host(tmp_path: Path, rows: dict[tuple[str, str], float], placements: list[Placement],
          **kwargs) -> HostCpu:
    cpus = kwargs.pop("cpus", 2)
    options = {"forward_on_cpu": True, "shared_lmcache": True, "has_lmcache": True,
               "router": False, **kwargs}
    return HostCpu(_spec(tmp_path, rows, cpus), placements, **options)


def test_a_process_is_stretched_by_the_others_load_on_its_cpus(tmp_path: Path) -> None:
    host = _host(tmp_path, {("api_server", "output_tokens"): 0.001}, [SINGLE])
    host.work(0, "output_tokens", 300)  # 0.3 CPU-s of the API server
    host.steps(0, host_s=0.2, forward_s=0.9)  # the host part all the engine core's here
    host.roll(1.0)
    # CPU 1 holds the API server (0.3), engine core (0.2), LMCache server and client (0):
    # each other process takes an equal share while it runs (the kernel's fair share)
    assert host.stretch("lmcache_server", 0) == pytest.approx(1 + 0.5)
    assert host.stretch("engine_core", 0) == pytest.approx(1 + 0.3)
    assert host.stretch("api_server", 0) == pytest.approx(1 + 0.2)
    # the worker is alone on CPU 0, whatever it spends; nobody else's steps run here
    assert host.stretch("worker", 0) == 1.0
    assert host.handoff_s(0) == 0.0


def test_an_unpinned_process_shares_every_cpu(tmp_path: Path) -> None:
    host = _host(tmp_path, {("client", "requests"): 0.1}, [Placement()], cpus=4)
    host.work(0, "requests", 8)  # 0.8 CPU-s over 1 s: four CPUs hold it and the API server
    host.roll(1.0)
    assert host.stretch("api_server", 0) == 1.0
    host.work(0, "requests", 50)  # 5 CPUs' worth: the API server gets 4 / 6 of a CPU
    host.roll(2.0)
    assert host.stretch("api_server", 0) == pytest.approx((1 + 5.0) / 4)


def test_the_host_part_splits_between_engine_core_and_worker(tmp_path: Path) -> None:
    rows = {("engine_core", "step_host_s"): 0.4, ("worker", "step_host_s"): 0.2}
    host = _host(tmp_path, rows, [SINGLE], forward_on_cpu=False)
    host.steps(0, host_s=1.0, forward_s=5.0)  # no forward pass on CPUs: not counted
    host.roll(1.0)
    loads = {p["role"]: p["load"] for p in host.loads()}
    assert loads["engine_core"] == pytest.approx(0.4) and loads["worker"] == pytest.approx(0.2)
    host.work(0, "requests", 0)
    host.spend("client", 0, 0.5)  # CPU 1: the engine core's host work stretches by 1.5
    host.roll(2.0)
    # 0.4 of the host part at 1.5, 0.2 (the worker's, alone) at 1, 0.4 waiting: not stretched
    assert host.host_stretch(0) == pytest.approx(0.4 * 1.5 + 0.2 + 0.4)


def test_the_load_is_per_interval_and_demand_scales_with_speed(tmp_path: Path) -> None:
    rows = {("api_server", "seconds"): 0.1}
    slow = HostCpu(_spec(tmp_path, rows, speed=0.5), [SINGLE], forward_on_cpu=True,
                   shared_lmcache=True, has_lmcache=True, router=False)
    slow.roll(2.0)
    assert slow.stretch("client", 0) == pytest.approx(1 + 0.2)  # 0.1 / 0.5
    slow.roll(4.0)  # the next interval: the same per-second demand, nothing else
    assert slow.stretch("client", 0) == pytest.approx(1 + 0.2)


def test_a_fleet_instance_shares_its_engine_cpu_with_the_other_front(tmp_path: Path) -> None:
    fleet = [Placement.for_instance(i, 2) for i in range(2)]
    host = _host(tmp_path, {}, fleet, shared_lmcache=False, router=True)
    host.handoff_wait_s = 0.003
    host.steps(1, host_s=0.4, forward_s=0.0)  # instance 1's engine core is on CPU 0
    host.roll(1.0)
    assert host.stretch("worker", 0) == pytest.approx(1 + 0.4)
    assert host.stretch("worker", 1) == 1.0
    # instance 0's worker wakes on CPU 0, busy 40 % with instance 1's engine core
    assert host.handoff_s(0) == pytest.approx(0.4 * 0.003)
    assert host.handoff_s(1) == 0.0
    assert {p["role"] for p in host.loads()} >= {"router", "client", "lmcache_server"}
    assert sum(p["role"] == "lmcache_server" for p in host.loads()) == 2  # private pools


def test_a_bad_demand_file_is_named(tmp_path: Path) -> None:
    spec = _spec(tmp_path, {("api_server", "furlongs"): 1.0})
    with pytest.raises(ValueError, match=r"demand.csv:2: unknown role or unit"):
        spec.demand()
    with pytest.raises(ValueError, match="does not exist"):
        HostCpuSpec(cpus=2, demand_csv=str(tmp_path / "none.csv")).demand()


def test_the_twin_stretches_what_shares_the_busy_cpus() -> None:
    """The tiny server at 20 sessions / min: its lookups, front ends and steps' host parts
    share CPU 1 (stretched), and without the host model nothing is."""
    from kvrepro._paths import data_file
    from kvrepro.engines.sim import load_profile, simulate
    from kvrepro.workload import build_workload

    profile = load_profile(data_file("servers", "cpu_tiny.yaml"))
    workload = build_workload("agentic", {"seed": 1, "session_rate_per_min": 20,
                                          "duration_s": 60, "context_cap_tokens": 7680})
    shared = simulate(workload, profile, "dram", progress=False).records
    alone = simulate(workload, profile.model_copy(update={"host_cpu": None}), "dram",
                     progress=False).records
    for column in ("front_stretch", "lookup_stretch", "host_stretch"):
        assert shared[column].max() > 1.05 and shared[column].min() >= 1.0
        assert (alone[column] == 1.0).all()
    # on the same requests (the host model's slower run serves fewer in the minute)
    both = shared.merge(alone, on=["session_id", "turn"], suffixes=("", "_alone"))
    assert both.ttft_s.median() > both.ttft_s_alone.median()


def test_the_host_part_split_is_measured_on_the_shipped_stacks() -> None:
    from kvrepro._paths import data_dir
    from kvrepro.calibration.fit_host import PROFILE_DIR, host_split
    from kvrepro.engines.sim import load_profile

    profile = load_profile(data_dir() / "servers" / "cpu_tiny.yaml")
    split = host_split(data_dir() / "live" / PROFILE_DIR, profile)
    assert 0 < split["worker"] < split["engine_core"] < 1
    assert split["engine_core"] + split["worker"] < 1  # the rest is waiting, not CPU


def test_a_fleet_reports_what_each_role_spent() -> None:
    """The fleet twin's stats carry the host model's CPU per role, as a single server's do
    (what notebook 13 sets beside the live fleet's process accounting)."""
    from kvrepro._paths import data_file
    from kvrepro.engines.sim.fleet import simulate_fleet
    from kvrepro.workload import build_workload

    workload = build_workload("agentic", {"seed": 1, "session_rate_per_min": 6,
                                          "duration_s": 40, "context_cap_tokens": 7680})
    stats = simulate_fleet(workload, data_file("fleets", "cpu_tiny_2x.yaml"),
                           progress=False).stats
    spent = stats["host_cpu_s"]
    assert {"worker", "engine_core", "api_server", "client", "router"} <= set(spent)
    assert spent["worker"] > 0 and stats["host_cpu_window_s"] > 0
