"""Peak memory of the trace and telemetry readers on files with one huge line (issue 24,
item 9), this checkout's readers and optionally an older checkout's side by side.

Usage: .venv/bin/python benchmarks/bench_readers_memory.py [--base PATH] [--scale 1.0]

Three files are generated into a temporary folder (deleted afterwards):

* `otlp-cut.jsonl`: ~150 MB of OTLP JSON lines (synthetic Claude Code weeks, seed 0,
  repeated) whose first line is cut in the middle, as the tail of a rotated export is;
  read with `read_claude_code` (lax);
* `mooncake-44mb-line.jsonl`: a Mooncake trace of 2,000 ordinary lines with one 44 MB line
  (a valid record with 5.5 M hash ids) in the middle; read with `read_mooncake_trace`
  (strict=False);
* `no-newline.bin`: 200 MB of JSON-like bytes without a newline; read with both readers
  (lax).

`--scale` multiplies the sizes (0.1 for a quick run). Each read runs in a fresh process
whose PYTHONPATH is the checkout (as benchmarks/bench_otlp.py does) and calls the public
reader with its defaults, so an older checkout runs the same call. The process reports
its resident set after its imports (VmRSS) and its peak at the end (VmHWM of
/proc/self/status; not `getrusage(...).ru_maxrss`, which Linux carries over from the parent
through fork and exec, so the parent's own peak from generating the files would show), and
what the reader returned or raised. Printed: peak RSS in MB,
the part above the resident set after the imports, and the outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 1e6
CASES = {  # case -> (file, reader)
    "otlp first line cut, ~150 MB": ("otlp-cut.jsonl", "claude_code"),
    "mooncake, one 44 MB line": ("mooncake-44mb-line.jsonl", "mooncake"),
    "200 MB without newline (mooncake)": ("no-newline.bin", "mooncake"),
    "200 MB without newline (otlp)": ("no-newline.bin", "claude_code"),
}


def write_otlp_cut(path: Path, size_bytes: int) -> None:
    """OTLP lines of one synthetic week, repeated to `size_bytes`, the first line cut."""
    from kvrepro.studies import synthetic_claude_code as synth

    spec = synth.SyntheticClaudeCodeSpec(seed=0)
    block = ("\n".join(synth.otlp_log_lines(synth.synthetic_requests(spec), spec))
             + "\n").encode()
    with open(path, "wb") as out:
        out.write(block[block.index(b"\n") // 2:])
        while out.tell() < size_bytes:
            out.write(block)


def mooncake_line(t_ms: int, n_blocks: int) -> bytes:
    ids = ", ".join(map(str, range(n_blocks)))
    return (f'{{"timestamp": {t_ms}, "input_length": {512 * n_blocks}, "output_length": 16, '
            f'"hash_ids": [{ids}]}}\n').encode()


def write_mooncake_long_line(path: Path, long_line_bytes: int) -> None:
    """2,000 ordinary lines with one valid record of about `long_line_bytes` between them."""
    n_ids = long_line_bytes // 8  # "1234567, " is ~8 bytes per id at these magnitudes
    with open(path, "wb") as out:
        for t in range(1000):
            out.write(mooncake_line(t, 4))
        out.write(mooncake_line(1000, n_ids))
        for t in range(1001, 2001):
            out.write(mooncake_line(t, 4))


def write_no_newline(path: Path, size_bytes: int) -> None:
    """`size_bytes` of a JSON array's start, without any newline."""
    chunk = b"1234567, " * 100_000
    with open(path, "wb") as out:
        out.write(b'{"timestamp": 0, "hash_ids": [')
        while out.tell() < size_bytes:
            out.write(chunk)


def _status_mb(field: str) -> float:
    """A memory figure of /proc/self/status: VmRSS (resident now) or VmHWM (its peak)."""
    status = Path("/proc/self/status").read_text()
    return int(status.split(f"{field}:")[1].split()[0]) * 1024 / MB


def _worker(reader: str, path: Path) -> None:
    """Read `path` with the kvrepro on PYTHONPATH; print peak RSS and the outcome as JSON."""
    from kvrepro.analysis.token_mix import read_claude_code
    from kvrepro.workload.trace_replay import read_mooncake_trace

    imports_mb = _status_mb("VmRSS")
    start = time.perf_counter()
    try:
        if reader == "mooncake":
            read = read_mooncake_trace(path, strict=False)
            outcome = f"{len(read.frame):,} rows, {read.n_skipped} skipped"
            reasons = read.skipped.reason
        else:
            telemetry = read_claude_code(path)
            outcome = f"{len(telemetry.frame):,} rows, {len(telemetry.skipped)} skipped"
            reasons = telemetry.skipped.reason
        if len(reasons):
            outcome += f" (first: {str(reasons.iloc[0])[:90]})"
    except Exception as exc:  # noqa: BLE001 - the outcome is what is measured
        outcome = f"{type(exc).__name__}: {str(exc)[:150]}"
    print(json.dumps({"imports_mb": imports_mb, "peak_mb": _status_mb("VmHWM"),
                      "wall_s": time.perf_counter() - start, "outcome": outcome}))


def measure(checkout: Path, reader: str, path: Path) -> dict:
    """One read in a fresh process with `checkout` first on its path."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, __file__, "--worker", reader, str(path)],
                          env=env, text=True, capture_output=True, check=False,
                          cwd=checkout)
    if done.returncode:
        return {"imports_mb": float("nan"), "peak_mb": float("nan"), "wall_s": float("nan"),
                "outcome": f"process failed (rc {done.returncode}): {done.stderr[-300:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def generate(folder: Path, scale: float) -> None:
    start = time.perf_counter()
    write_otlp_cut(folder / "otlp-cut.jsonl", int(150 * MB * scale))
    write_mooncake_long_line(folder / "mooncake-44mb-line.jsonl", int(44 * MB * scale))
    write_no_newline(folder / "no-newline.bin", int(200 * MB * scale))
    sizes = ", ".join(f"{p.name} {p.stat().st_size / MB:.1f} MB"
                      for p in sorted(folder.iterdir()))
    print(f"generated {sizes} in {time.perf_counter() - start:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, default=None,
                        help="older checkout to compare with (e.g. a git worktree of HEAD)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the file sizes")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker[0], Path(args.worker[1]))
        return
    checkouts = {"current": ROOT}
    if args.base:
        checkouts = {f"base ({args.base})": args.base.resolve(), **checkouts}
    folder = Path(tempfile.mkdtemp(prefix="kvrepro-bench-readers-"))
    try:
        generate(folder, args.scale)
        for case, (name, reader) in CASES.items():
            print(case)
            for label, checkout in checkouts.items():
                got = measure(checkout, reader, folder / name)
                print(f"  {label}: peak RSS {got['peak_mb']:.0f} MB "
                      f"({got['peak_mb'] - got['imports_mb']:+.0f} MB over the RSS after imports, "
                      f"{got['imports_mb']:.0f} MB), {got['wall_s']:.2f} s; {got['outcome']}")
    finally:
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
