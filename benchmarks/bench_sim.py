"""Time the simulator on study A's campaign: default agentic workload, three tiers, 90 min.

Usage: .venv/bin/python benchmarks/bench_sim.py [--tier dram] [--profile] [--tracemalloc]
                                                [--skip-campaign]
Prints wall time, peak memory (the process's max RSS from getrusage) and simulated requests
per second for one tier and for the three-tier campaign (target: campaign under 60 s on one
core, under 2 GiB). `--tracemalloc` repeats the one-tier run under tracemalloc for the peak of
Python allocations (tracemalloc roughly doubles the run time, so it is not used for timing);
`--profile` adds a cProfile of the one-tier run (top functions by own time).

It simulates what `make reproduce` simulates: the calibrated study-A profile
(`data/servers/study_a.yaml`) on study A's workload with the fitted 60 s mean pause
(`kvrepro.engines.sim.study_a.STUDY_A_PAUSE`).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import resource
import time
import tracemalloc
from pathlib import Path

from kvrepro.engines.sim import SimProfile, load_profile, simulate
from kvrepro.engines.sim.study_a import STUDY_A_PAUSE
from kvrepro.workload import AgenticSpec, generate_agentic
from kvrepro.workload.base import Workload

PROFILE = Path(__file__).resolve().parents[1] / "data" / "servers" / "study_a.yaml"
TIERS = ("baseline", "dram", "flash")


def _max_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def _run(workload: Workload, profile: SimProfile, tiers: tuple[str, ...]) -> None:
    start = time.perf_counter()
    requests = 0
    for tier in tiers:
        t0 = time.perf_counter()
        result = simulate(workload, profile, tier, progress=False)
        wall_s = time.perf_counter() - t0
        requests += len(result.records)
        s = result.stats
        print(f"  {tier:8s} {wall_s:6.2f} s  {len(result.records):6d} requests "
              f"({len(result.records) / wall_s:7.0f} req/s), {s['steps']} steps, "
              f"{s['preemptions']} preemptions, sim end {s['end_s']:.0f} s")
    wall_s = time.perf_counter() - start
    print(f"  total {wall_s:.2f} s, {requests / wall_s:.0f} simulated requests/s, "
          f"process max RSS so far {_max_rss_gib():.2f} GiB")


def _traced_peak_mib(workload: Workload, profile: SimProfile, tier: str) -> float:
    tracemalloc.start()
    simulate(workload, profile, tier, progress=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tier", default="dram", choices=TIERS)
    parser.add_argument("--profile", action="store_true", help="cProfile the one-tier run")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="peak Python allocations of the one-tier run (slow)")
    parser.add_argument("--skip-campaign", action="store_true")
    args = parser.parse_args()
    profile = load_profile(PROFILE)
    t0 = time.perf_counter()
    workload = generate_agentic(AgenticSpec(pause=STUDY_A_PAUSE))
    print(f"workload: {len(workload.sessions)} sessions, {len(workload.turns)} turns "
          f"({time.perf_counter() - t0:.2f} s to generate, not counted below)")
    print(f"one tier ({args.tier}):")
    _run(workload, profile, (args.tier,))
    if not args.skip_campaign:
        print("three-tier campaign:")
        _run(workload, profile, TIERS)
    if args.tracemalloc:
        print(f"tracemalloc peak of one {args.tier} run: "
              f"{_traced_peak_mib(workload, profile, args.tier):.0f} MiB")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(simulate, workload, profile, args.tier, progress=False)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
        print(out.getvalue())


if __name__ == "__main__":
    main()
