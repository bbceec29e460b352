"""Parse speed of the Claude Code telemetry reader on a ~100 MB OTLP JSON export, the
current reader and the previous one side by side in one run (target: >= 200 MB/s).

Usage: .venv/bin/python benchmarks/bench_otlp.py [--size-mb 100] [--repeats 3] [--gzip]

The export is generated into a temporary folder (deleted afterwards): synthetic weeks of
Claude Code traffic (`kvrepro.workload.synthetic_claude_code`, seeds 0, 1, ...) appended
until the file
reaches the size, in the collector file exporter's format with the attributes Claude Code
sends (~1.4 KB per api_request). Every record is an api_request, the worst case for the
reader: a real export also holds tool_result and other events, which it only counts.

"previous" is the reader before its msgspec path (benchmarks/_otlp_reference.py, a copy
of commit e68b3c6's reader); "current" is `kvrepro.analysis.token_mix.read_claude_code`.
The two run in turns (previous, current, previous, ...) so that a change in the machine's
load hits both alike, and must return the same frame and skips. Prints MB/s
(uncompressed bytes per second of wall-clock) as the median of the repeats, and the load
average, since a busy machine slows both.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _otlp_reference as previous
import pandas as pd

from kvrepro.analysis.token_mix import read_claude_code
from kvrepro.workload import synthetic_claude_code as synth

READERS: dict[str, Callable[[Path], Any]] = {
    "previous (e68b3c6: regex + json)": previous.read_claude_code,
    "current (msgspec + regex)": read_claude_code,
}


def generate(path: Path, size_bytes: int) -> int:
    """Append synthetic weeks (one seed each) to `path` until it holds `size_bytes`;
    returns the number of api_request records written."""
    records, seed = 0, 0
    with open(path, "w") as out:
        while out.tell() < size_bytes:
            spec = synth.SyntheticClaudeCodeSpec(seed=seed)
            requests = synth.synthetic_requests(spec)
            out.write("\n".join(synth.otlp_log_lines(requests, spec)) + "\n")
            records += len(requests)
            seed += 1
    return records


def time_readers(path: Path, repeats: int) -> dict[str, list[float]]:
    """Wall-clock seconds of each reader per repeat, in turns; checks that both return
    the same frame, skips and ignored counts."""
    times_s: dict[str, list[float]] = {label: [] for label in READERS}
    results = {}
    for _ in range(repeats):
        for label, read in READERS.items():
            start = time.perf_counter()
            results[label] = read(path)
            times_s[label].append(time.perf_counter() - start)
    old, new = results.values()
    pd.testing.assert_frame_equal(old.frame, new.frame)
    pd.testing.assert_frame_equal(old.skipped, new.skipped)
    assert old.ignored == new.ignored
    print(f"  both: the same {len(new.frame):,} rows, {len(new.skipped)} skips and "
          f"{sum(new.ignored.values())} ignored events")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=float, default=100.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gzip", action="store_true", help="also time the gzip'd export")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="kvrepro-bench-otlp-"))
    try:
        path = folder / "claude_code_export.jsonl"
        start = time.perf_counter()
        records = generate(path, int(args.size_mb * 1e6))
        size = path.stat().st_size
        print(f"generated {size / 1e6:.1f} MB, {records:,} api_request records "
              f"({size / records:.0f} B each) in {time.perf_counter() - start:.1f} s; "
              f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        print("OTLP JSON lines")
        report(size, time_readers(path, args.repeats))
        if args.gzip:
            packed = folder / "claude_code_export.jsonl.gz"
            with open(path, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            print("same, gzip (uncompressed MB/s)")
            report(size, time_readers(packed, args.repeats))
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
