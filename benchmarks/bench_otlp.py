"""Parse speed of the Claude Code telemetry reader on a ~100 MB OTLP JSON export (target:
>= 50 MB/s).

Usage: .venv/bin/python benchmarks/bench_otlp.py [--size-mb 100] [--repeats 3] [--gzip]

The export is generated into a temporary folder (deleted afterwards): synthetic weeks of
Claude Code traffic (`kvrepro.workload.synthetic_claude_code`, seeds 0, 1, ...) appended
until the file
reaches the size, in the collector file exporter's format with the attributes Claude Code
sends (~1.4 KB per api_request). Every record is an api_request, the worst case for the
reader: a real export also holds tool_result and other events, which it only counts.
Prints MB/s (uncompressed bytes per second of wall-clock) as the median of the repeats.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from kvrepro.analysis.token_mix import read_claude_code
from kvrepro.workload import synthetic_claude_code as synth


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


def time_read(path: Path, repeats: int) -> tuple[list[float], int]:
    """Wall-clock seconds of `read_claude_code` per repeat, and the rows it returned."""
    times_s, rows = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        rows = len(read_claude_code(path).frame)
        times_s.append(time.perf_counter() - start)
    return times_s, rows


def report(label: str, size_bytes: int, times_s: list[float], rows: int) -> None:
    rates = [size_bytes / 1e6 / t for t in times_s]
    print(f"{label}: {statistics.median(rates):.1f} MB/s median "
          f"(min {min(rates):.1f}, max {max(rates):.1f}; {len(times_s)} runs, "
          f"{statistics.median(times_s):.2f} s for {size_bytes / 1e6:.1f} MB, {rows:,} rows)")


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
              f"({size / records:.0f} B each) in {time.perf_counter() - start:.1f} s")
        report("OTLP JSON lines", size, *time_read(path, args.repeats))
        if args.gzip:
            packed = folder / "claude_code_export.jsonl.gz"
            with open(path, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            report("same, gzip (uncompressed MB/s)", size, *time_read(packed, args.repeats))
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
