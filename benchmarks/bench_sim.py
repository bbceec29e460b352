"""Time the simulator on study A's campaign: default agentic workload, three tiers, 90 min.

Usage: .venv/bin/python benchmarks/bench_sim.py [--tier dram] [--profile] [--tracemalloc]
                                                [--skip-campaign]
Prints wall time, peak memory (the process's max RSS from getrusage) and simulated requests
per second for one tier and for the three-tier campaign (target: campaign under 60 s on one
core, under 2 GiB). `--tracemalloc` repeats the one-tier run under tracemalloc for the peak of
Python allocations (tracemalloc roughly doubles the run time, so it is not used for timing);
`--profile` adds a cProfile of the one-tier run (top functions by own time).

The profile below is only *roughly* study A's server (4x RTX PRO 6000 Blackwell, TP4,
MiniMax-M2.7 FP8, vLLM + LMCache); it is for timing the simulator, not a calibration:
* fp16_tflops 4 x 2,000: effective dense FP8 of four GPUs (rough; datasheet peaks vary by
  format and sparsity);
* mem_bw_tb_s 4 x 1.6: GDDR7 bandwidth per GPU, rounded down (rough);
* gpu_kv_bytes 115 GB: 4 x 96 GB x 0.9 minus ~230 GB of FP8 weights;
* DRAM tier 512 GB (study A); flash tier 40 TB behind a 64 GB staging buffer (study A's
  RAID10 array holds ~51 TB); bandwidths are guesses of LMCache's effective rates.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import resource
import time
import tracemalloc

from kvrepro.sim import SimProfile, simulate
from kvrepro.workload import generate_agentic
from kvrepro.workload.base import Workload

GB = 1e9

STUDY_A_ROUGH = {
    "description": "rough study-A server for benchmarking the simulator (not calibrated)",
    "sample_interval_s": 10,
    "server": {"model": "MiniMax-M2.7-FP8", "fp16_tflops": 4 * 2000, "mem_bw_tb_s": 4 * 1.6,
               "mfu": 0.4, "decode_efficiency": 0.7, "step_overhead_s": 0.005,
               "gpu_kv_bytes": 115 * GB, "block_tokens": 16, "max_batched_tokens": 8192,
               "max_num_seqs": 256, "max_model_len": 65_536},
    "tiers": {
        "baseline": {},
        "dram": {"offload": [{"name": "dram", "capacity_bytes": 512 * GB,
                              "read_bw_bytes_s": 40 * GB, "write_bw_bytes_s": 40 * GB}]},
        "flash": {"offload": [
            {"name": "staging", "capacity_bytes": 64 * GB, "read_bw_bytes_s": 40 * GB,
             "write_bw_bytes_s": 40 * GB},
            {"name": "flash", "capacity_bytes": 40_000 * GB, "read_bw_bytes_s": 12 * GB,
             "write_bw_bytes_s": 6 * GB, "chunk_read_latency_s": 0.0002,
             "chunk_write_latency_s": 0.0002}]},
    },
}
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
    profile = SimProfile.model_validate(STUDY_A_ROUGH)
    t0 = time.perf_counter()
    workload = generate_agentic()
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
