"""Time generating the default 90-minute agentic workload (target: well under 10 s).

Usage: .venv/bin/python benchmarks/bench_workload.py [--repeats 5]
Prints the median and range of wall-clock seconds, and the workload's size.
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvrepro.workload import AgenticSpec, generate_agentic, summarize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    times_s = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        workload = generate_agentic(AgenticSpec())
        times_s.append(time.perf_counter() - start)
    start = time.perf_counter()
    ids = workload.prompt_ids(0, int(workload.turns[workload.turns.session_id == 0].turn.max()))
    prompt_s = time.perf_counter() - start
    info = summarize(workload)
    print(f"generate_agentic (default, 90 min): median {statistics.median(times_s):.3f} s "
          f"(min {min(times_s):.3f}, max {max(times_s):.3f}, {args.repeats} runs)")
    print(f"  {int(info.sessions)} sessions, {int(info.turns)} turns, "
          f"{int(info.prompt_tokens_total):,} prompt tokens")
    print(f"prompt_ids of session 0's last turn ({len(ids):,} tokens): {prompt_s:.3f} s")


if __name__ == "__main__":
    main()
