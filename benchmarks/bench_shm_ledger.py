"""What a run's shared-memory ledger costs its reader after a server made many transient
multiprocessing locks (issue 37, item 8), this checkout and optionally an older one side by
side.

Usage: .venv/bin/python benchmarks/bench_shm_ledger.py [--base PATH] [--locks 20000]
       [--samples 30]

For each checkout, in a fresh process whose PYTHONPATH is that checkout (as
benchmarks/bench_readers_memory.py does): a `SharedMemory` of the run, and a "server" started
with its `environment()` (so the checkout's own `shm_ledger/sitecustomize.py` writes the
ledger) that creates `--locks` spawn-context `multiprocessing.Lock()`s, each dropped at once
(its semaphore unlinked), then keeps one. Then `SharedMemory.sample(())` is called as the
run's watcher calls it once a second (no pids: only the ledger's share of the work): the first
sample, and `--samples` more while nothing new happens. Printed: the ledger's lines and bytes,
the segments the reader keeps (`seen`), the first sample's time, the median time of the later
samples and the ledger bytes each of them read (rchar of /proc/thread-self/io, less what
reading that file adds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER = r"""
import multiprocessing as mp, sys
mp.set_start_method("spawn")
for _ in range(int(sys.argv[1])):
    mp.Lock()
kept = mp.Lock()
print(kept._semlock.name, flush=True)
sys.stdin.readline()
"""


def _rchar() -> int:
    text = Path("/proc/thread-self/io").read_text()
    return int(text.split("rchar:")[1].split()[0])


def _worker(locks: int, samples: int) -> None:
    """Run the server and sample with the kvrepro on PYTHONPATH; print the figures as JSON."""
    from kvrepro.engines.live.ownership import SharedMemory

    with tempfile.TemporaryDirectory(prefix="kvrepro-bench-shm-") as run_dir:
        shm = SharedMemory()
        env = shm.environment(dict(os.environ), Path(run_dir))
        server = subprocess.Popen([sys.executable, "-c", SERVER, str(locks)], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            server.stdout.readline()
            start = time.perf_counter()
            shm.sample(())
            first_s = time.perf_counter() - start
            times_s, read_bytes = [], []
            overhead = -(_rchar() - _rchar())  # what reading /proc/thread-self/io adds
            for _ in range(samples):
                before, start = _rchar(), time.perf_counter()
                shm.sample(())
                times_s.append(time.perf_counter() - start)
                read_bytes.append(_rchar() - before - overhead)
            text = shm.ledger.read_text()
            print(json.dumps({"lines": text.count("\n"), "bytes": len(text.encode()),
                              "seen": len(shm.seen), "first_ms": first_s * 1e3,
                              "median_ms": statistics.median(times_s) * 1e3,
                              "median_bytes": statistics.median(read_bytes)}))
        finally:
            server.communicate("\n")


def measure(checkout: Path, locks: int, samples: int) -> dict:
    """One run in a fresh process with `checkout` first on its path."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, __file__, "--worker", str(locks), str(samples)],
                          env=env, text=True, capture_output=True, check=False, cwd=checkout)
    if done.returncode:
        raise SystemExit(f"{checkout}: worker failed (rc {done.returncode}): "
                         f"{done.stderr[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, default=None,
                        help="older checkout to compare with (e.g. a git worktree of 6065f95)")
    parser.add_argument("--locks", type=int, default=20_000, help="transient locks made")
    parser.add_argument("--samples", type=int, default=30, help="samples after the first")
    parser.add_argument("--worker", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(*args.worker)
        return
    checkouts = {"current": ROOT}
    if args.base:
        checkouts = {f"base ({args.base})": args.base.resolve(), **checkouts}
    print(f"{args.locks:,} transient locks + 1 kept; {args.samples} samples after the first")
    for label, checkout in checkouts.items():
        got = measure(checkout, args.locks, args.samples)
        print(f"  {label}: ledger {got['lines']:,} lines, {got['bytes']:,} bytes; reader "
              f"keeps {got['seen']}; first sample {got['first_ms']:.1f} ms; later samples: "
              f"median {got['median_ms']:.2f} ms, {got['median_bytes']:,.0f} ledger bytes "
              "read each")


if __name__ == "__main__":
    main()
