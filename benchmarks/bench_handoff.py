"""How long a polling process waits to run when another process is busy on its CPU.

Why: vLLM 0.32's shared-memory queue readers poll with sched_yield (`shm_broadcast`); woken
on a CPU where another process computes (a live fleet puts one instance's engine core on
the other's worker CPU), the reader runs only when the kernel ends that process's slice.
The twin's host model (`kvrepro.engines.sim.host_cpu`, `HostCpuSpec.handoff_wait_s`) adds
that wait per step; this script measures it on this machine.

A writer on CPU 0 stamps shared memory every 5 ms (a step elsewhere); a reader on CPU 1
polls it as vLLM does (check, sched_yield) and records the delay; CPU 1 also runs a
competitor busy a share `duty` of each 2 ms (1.0: always). Prints the median, mean and p90
delay per duty; `--out FILE` writes the median with the competitor always busy
(`handoff_wait_s`) as JSON.

    python benchmarks/bench_handoff.py [--out data/live/cpu_tiny_host_profile/handoff.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

SAMPLES = 400
PERIOD_S = 0.002


def _competitor(stop, duty: float) -> None:
    os.sched_setaffinity(0, {1})
    while not stop.value:
        start = time.perf_counter()
        while time.perf_counter() - start < PERIOD_S * duty:
            pass
        if duty < 1:
            time.sleep(PERIOD_S * (1 - duty))


def _reader(stamp, seen, stop, out) -> None:
    os.sched_setaffinity(0, {1})
    last, delays = 0.0, []
    while len(delays) < SAMPLES:
        value = stamp.value
        if value != last:
            delays.append(time.perf_counter() - value)
            last = seen.value = value
        else:
            os.sched_yield()
    stop.value = 1
    out.put(delays)


def _writer(stamp, seen, stop) -> None:
    os.sched_setaffinity(0, {0})
    for _ in range(SAMPLES):
        time.sleep(0.005)
        now = time.perf_counter()
        stamp.value = now
        while seen.value != now and not stop.value:
            pass


def delays_s(duty: float) -> list[float]:
    """The reader's delays with a competitor busy `duty` of the time on its CPU."""
    stamp, seen = mp.Value(ctypes.c_double, 0.0, lock=False), mp.Value(ctypes.c_double, 0.0,
                                                                         lock=False)
    stop, out = mp.Value(ctypes.c_int, 0, lock=False), mp.Queue()
    procs = [mp.Process(target=_reader, args=(stamp, seen, stop, out)),
             mp.Process(target=_writer, args=(stamp, seen, stop))]
    if duty > 0:
        procs.append(mp.Process(target=_competitor, args=(stop, duty)))
    for proc in procs:
        proc.start()
    delays = out.get()
    for proc in procs:
        proc.join()
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write {'handoff_wait_s': median at duty 1} here")
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two CPUs (the writer on CPU 0, the reader on CPU 1)")
    medians = {}
    for duty in (0.0, 0.5, 0.75, 1.0):
        delays = sorted(delays_s(duty))
        medians[duty] = statistics.median(delays)
        print(f"competitor busy {duty:4.0%}: median {medians[duty] * 1e3:.3f} ms, mean "
              f"{statistics.mean(delays) * 1e3:.3f} ms, p90 "
              f"{delays[int(0.9 * len(delays))] * 1e3:.3f} ms")
    if args.out:
        record = {"handoff_wait_s": round(medians[1.0], 6), "idle_wait_s": round(medians[0.0], 6),
                  "kernel": os.uname().release, "measured_by": "benchmarks/bench_handoff.py"}
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
