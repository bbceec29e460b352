"""Parse speed of the Claude Code telemetry reader on a ~100 MB OTLP JSON export, this
checkout's reader and an older checkout's side by side in one run (target: >= 200 MB/s).

Usage: .venv/bin/python benchmarks/bench_otlp.py [--size-mb 100] [--repeats 3] [--gzip]
                                                 [--base PATH]

The export is generated into a temporary folder (deleted afterwards): synthetic weeks of
Claude Code traffic (`kvrepro.studies.synthetic_claude_code`, seeds 0, 1, ...) appended
until the file reaches the size, in the collector file exporter's format with the attributes
Claude Code sends (~1.4 KB per api_request). Every record is an api_request, the worst case
for the reader: a real export also holds tool_result and other events, which it only counts.

"previous" is `kvrepro.analysis.token_mix.read_claude_code` of `--base` (default: a
temporary `git worktree` of commit e68b3c6, the reader before its msgspec path, removed
afterwards); "current" is this checkout's. Each read runs in a fresh process whose
PYTHONPATH is the checkout (as benchmarks/bench_sim.py does), timed inside it after its
imports; the two run in turns (previous, current, previous, ...) so that a change in the
machine's load hits both alike, and must return the same frame, skips and ignored counts.
Prints MB/s (uncompressed bytes per second of wall-clock) as the median of the repeats,
and the load average, since a busy machine slows both.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
PREVIOUS_COMMIT = "e68b3c6"


def generate(path: Path, size_bytes: int) -> int:
    """Append synthetic weeks (one seed each) to `path` until it holds `size_bytes`;
    returns the number of api_request records written."""
    from kvrepro.studies import synthetic_claude_code as synth

    records, seed = 0, 0
    with open(path, "w") as out:
        while out.tell() < size_bytes:
            spec = synth.SyntheticClaudeCodeSpec(seed=seed)
            requests = synth.synthetic_requests(spec)
            out.write("\n".join(synth.otlp_log_lines(requests, spec)) + "\n")
            records += len(requests)
            seed += 1
    return records


def _worker(path: Path, out: Path) -> None:
    """Read `path` with the kvrepro on PYTHONPATH; pickle the result's frame, skips and
    ignored counts to `out`, print the read's wall time as JSON."""
    from kvrepro.analysis.token_mix import read_claude_code

    start = time.perf_counter()
    result = read_claude_code(path)
    wall_s = time.perf_counter() - start
    with open(out, "wb") as f:
        pickle.dump((result.frame, result.skipped, dict(result.ignored)), f)
    print(json.dumps({"wall_s": wall_s}))


def _read_in(checkout: Path, path: Path, out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, __file__, "--worker", str(path), str(out)],
                          env=env, text=True, capture_output=True, check=False)
    if done.returncode:
        raise RuntimeError(f"reader of {checkout} failed on {path}:\n{done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["wall_s"])


def time_readers(path: Path, repeats: int, checkouts: dict[str, Path]) -> dict[str, list[float]]:
    """Wall-clock seconds of each checkout's reader per repeat, in turns; checks that both
    return the same frame, skips and ignored counts."""
    times_s: dict[str, list[float]] = {label: [] for label in checkouts}
    outs = {label: path.parent / f"result-{i}.pickle" for i, label in enumerate(checkouts)}
    for _ in range(repeats):
        for label, checkout in checkouts.items():
            times_s[label].append(_read_in(checkout, path, outs[label]))
    (old_frame, old_skipped, old_ignored), (frame, skipped, ignored) = (
        pickle.loads(out.read_bytes()) for out in outs.values())
    pd.testing.assert_frame_equal(old_frame, frame)
    pd.testing.assert_frame_equal(old_skipped, skipped)
    assert old_ignored == ignored
    print(f"  both: the same {len(frame):,} rows, {len(skipped)} skips and "
          f"{sum(ignored.values())} ignored events")
    return times_s


def report(size_bytes: int, times_s: dict[str, list[float]]) -> None:
    """MB/s of each reader: median, min and max over the repeats; the speed-up."""
    medians = {}
    for label, seconds in times_s.items():
        rates = [size_bytes / 1e6 / t for t in seconds]
        medians[label] = statistics.median(rates)
        print(f"  {label}: {medians[label]:.1f} MB/s median "
              f"(min {min(rates):.1f}, max {max(rates):.1f}; {len(seconds)} runs, "
              f"{statistics.median(seconds):.2f} s for {size_bytes / 1e6:.1f} MB)")
    old, new = medians.values()
    print(f"  speed-up (medians): {new / old:.2f}x")


def _previous_worktree(folder: Path) -> Path:
    """A `git worktree` of PREVIOUS_COMMIT in `folder` (removed by `_remove_worktree`)."""
    checkout = folder / "previous"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet",
                    str(checkout), PREVIOUS_COMMIT], check=True)
    return checkout


def _remove_worktree(checkout: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(checkout)],
                   check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=100.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gzip", action="store_true", help="also time the gzip'd export")
    parser.add_argument("--base", type=Path, default=None,
                        help=f"older checkout to compare with (default: {PREVIOUS_COMMIT})")
    parser.add_argument("--worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(*args.worker)
        return
    folder = Path(tempfile.mkdtemp(prefix="kvrepro-bench-otlp-"))
    base = None
    try:
        base = args.base.resolve() if args.base else _previous_worktree(folder)
        label = args.base or PREVIOUS_COMMIT
        checkouts = {f"previous ({label})": base, "current (this checkout)": ROOT}
        path = folder / "claude_code_export.jsonl"
        start = time.perf_counter()
        records = generate(path, int(args.size_mb * 1e6))
        size = path.stat().st_size
        print(f"generated {size / 1e6:.1f} MB, {records:,} api_request records "
              f"({size / records:.0f} B each) in {time.perf_counter() - start:.1f} s; "
              f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        print("OTLP JSON lines")
        report(size, time_readers(path, args.repeats, checkouts))
        if args.gzip:
            packed = folder / "claude_code_export.jsonl.gz"
            with open(path, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            print("same, gzip (uncompressed MB/s)")
            report(size, time_readers(packed, args.repeats, checkouts))
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
    finally:
        if base is not None and args.base is None:
            _remove_worktree(base)
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
