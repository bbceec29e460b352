"""Time a sweep on a local Ray: the shipped what-if grid, from Ray's start to the table.

Usage: .venv/bin/python benchmarks/bench_sweep.py [--grid data/sweeps/whatif_48.yaml]
                                                  [--max-parallel N] [--out DIR]
Prints the time Ray takes to start, the sweep's wall time, the points' own wall times (sum,
median, max: the sum over the wall time is how many points ran at once on average), and the
time a rerun of the finished sweep takes (it runs nothing: every point has its file). The
sweep goes to a temporary folder unless `--out` is given (then it is resumed if it exists).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from kvrepro.sweep import _loopback_node, load_grid, run_sweep

GRID = Path(__file__).resolve().parents[1] / "data" / "sweeps" / "whatif_48.yaml"


def _bench(grid: Path, out: Path, max_parallel: int | None) -> None:
    import ray

    points, point_fn, _ = load_grid(grid)
    t0 = time.perf_counter()
    with _loopback_node():  # as a sweep's own local Ray: the loopback only
        ray.init(num_cpus=max_parallel, include_dashboard=False, log_to_driver=False)
    start_s = time.perf_counter() - t0
    try:
        table = run_sweep(points, out, point_fn=point_fn, progress=False)
        again = run_sweep(points, out, point_fn=point_fn, progress=False)
    finally:
        ray.shutdown()
    cpus = max_parallel or "all"
    print(f"grid {grid.name}: {len(points)} points, Ray ({cpus} CPUs) started in {start_s:.1f} s")
    print(f"  sweep: ran {table.attrs['ran']} ({table.attrs['failed']} failed) in "
          f"{table.attrs['wall_s']:.1f} s; points' own wall time sum "
          f"{table.wall_s.sum():.1f} s, median {table.wall_s.median():.2f} s, max "
          f"{table.wall_s.max():.2f} s ({table.wall_s.sum() / table.attrs['wall_s']:.2f} at once)")
    print(f"  rerun: skipped {again.attrs['skipped']}, ran {again.attrs['ran']} in "
          f"{again.attrs['wall_s']:.2f} s")
    print(f"  total from Ray's start: {time.perf_counter() - t0:.1f} s -> {out}/sweep.parquet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grid", type=Path, default=GRID)
    parser.add_argument("--max-parallel", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.out:
        _bench(args.grid, args.out, args.max_parallel)
        return
    with tempfile.TemporaryDirectory(prefix="bench_sweep_") as tmp:
        _bench(args.grid, Path(tmp) / "sweep", args.max_parallel)


if __name__ == "__main__":
    main()
