"""Time the KV working set of the Mooncake conversation trace on a 1-minute grid (target < 2 s).

Usage: .venv/bin/python benchmarks/bench_working_set.py [--repeats 5] [--trace PATH]
Reads the trace once (not timed), then times `working_set` from the reader's frame (flattening
the hash ids included) at a 10-minute TTL with Qwen3-14B's 163,840 B per token, under the
default partial-block rule (full blocks only, what a KV store holds). Prints the median and
range of wall-clock seconds, the peak (GB) and its time, and B2's two numbers under each
partial-block rule (`working_set_by_rule`), so the definition's weight is visible.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from kvrepro.analysis.block_traces import (
    partial_blocks_label,
    working_set,
    working_set_by_rule,
    working_set_summary,
)
from kvrepro.model_spec import kv_bytes_per_token
from kvrepro.workload.trace_replay import read_mooncake_trace

DEFAULT_TRACE = (Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mooncake"
                 / "conversation_trace.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--ttl-s", type=float, default=600.0)
    args = parser.parse_args()
    result = read_mooncake_trace(args.trace)
    kv_per_token = kv_bytes_per_token("Qwen3-14B-BF16")
    times_s = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        ws = working_set(result.frame, result.block_size, kv_per_token, ttl_s=args.ttl_s,
                         grid_s=60.0)
        times_s.append(time.perf_counter() - start)
    peak = ws.loc[ws.ws_bytes.idxmax()]
    summary = working_set_summary(ws)
    print(f"working_set (Mooncake conversation, {len(result.frame):,} requests, "
          f"{args.ttl_s:g} s TTL, 1-min grid, {partial_blocks_label()}): median "
          f"{statistics.median(times_s):.3f} s (min {min(times_s):.3f}, max {max(times_s):.3f}, "
          f"{args.repeats} runs)")
    print(f"  peak {peak.ws_gb:,.1f} GB at minute {peak.time_min:.0f}; "
          f"{summary['ws_start_gb']:,.1f} GB at minute {summary['start_time_min']:.0f}")
    by_rule = working_set_by_rule(result, kv_bytes_per_token=kv_per_token, ttl_s=args.ttl_s)
    print(by_rule.round(1).to_string(index=False))


if __name__ == "__main__":
    main()
