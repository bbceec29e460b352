"""How long the load client waits for its CPU when the server is in another session.

Why: with the kernel's autogroup on, each session is a scheduling group and a CPU is shared
between groups before threads. Live runs used to start vLLM in a session of its own; the
load client, on the CPU vLLM's engine core and API server use (the spec's placement on two
cores), then waited 70-400 ms at a time, runnable, and stamped a whole streamed answer as
its first token (perf sched, 2026-12-05). `ManagedProcess` now keeps servers in the
caller's session. This script shows both, side by side, on one server.

It deploys the spec's small-kv tier once (pinned as the spec says) and runs a probe client,
pinned to the client CPUs, in turns: in the server's session (as runs are now) and in a new
session (`setsid`, as the server's was before). Each probe streams three answers at a time
(prompts of 200-3,000 tokens, 200 tokens out) and times its own event loop with a 5 ms
sleep. Prints, per probe and as medians per condition: stalls over 20 ms per minute, the
longest, the client's run-queue wait per second (schedstat), TTFT median and p90, and the
share of answers that arrived in one burst (first to last chunk under 1 ms).

    python benchmarks/bench_autogroup.py [--seconds 30] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STREAMS = 3
PROMPT_TOKENS = (200, 1000, 3000)
OUTPUT_TOKENS = 200
STALL_S = 0.02


def _schedstat_wait_s() -> float:
    return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9


async def _stream(session, url: str, seed: int, stop: asyncio.Event, answers: list) -> None:
    rnd = random.Random(seed)
    while not stop.is_set():
        prompt = [rnd.randrange(100, 30000) for _ in range(rnd.choice(PROMPT_TOKENS))]
        body = {"model": "tiny", "prompt": prompt, "max_tokens": OUTPUT_TOKENS,
                "ignore_eos": True, "temperature": 0, "stream": True}
        sent, chunks = time.perf_counter(), []
        async with session.post(url, json=body) as response:
            async for _ in response.content.iter_any():
                chunks.append(time.perf_counter())
        answers.append((chunks[0] - sent, chunks[-1] - chunks[0]))
        await asyncio.sleep(rnd.uniform(0.2, 1.0))


async def _watch_loop(stop: asyncio.Event, stalls: list) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(0.005)
        late = time.perf_counter() - started - 0.005
        if late > STALL_S:
            stalls.append(late)


async def _probe_main(base_url: str, seconds: float) -> dict[str, float]:
    import aiohttp

    stop, answers, stalls = asyncio.Event(), [], []
    waited = _schedstat_wait_s()
    async with aiohttp.ClientSession() as session:
        url = base_url + "/v1/completions"
        tasks = [asyncio.create_task(_stream(session, url, i, stop, answers))
                 for i in range(STREAMS)]
        tasks.append(asyncio.create_task(_watch_loop(stop, stalls)))
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    ttfts = sorted(a[0] for a in answers)
    return {"stalls_per_min": 60 * len(stalls) / seconds,
            "longest_stall_ms": 1e3 * max(stalls, default=0.0),
            "runqueue_wait_ms_per_s": 1e3 * (_schedstat_wait_s() - waited) / seconds,
            "ttft_median_ms": 1e3 * statistics.median(ttfts),
            "ttft_p90_ms": 1e3 * ttfts[int(0.9 * (len(ttfts) - 1))],
            "burst_share": sum(a[1] < 1e-3 for a in answers) / len(answers),
            "answers": len(answers)}


def _probe(base_url: str, seconds: float, own_session: bool, cpus: frozenset[int] | None
           ) -> dict[str, float]:
    """One probe client in a child process (its own session or the caller's)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--probe", base_url, str(seconds), out.name]
        subprocess.run(command, check=True, start_new_session=own_session,
                       preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        return json.loads(Path(out.name).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--server", default=str(ROOT / "data/servers/cpu_tiny.yaml"))
    parser.add_argument("--probe", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        base_url, seconds, out = args.probe
        Path(out).write_text(json.dumps(asyncio.run(_probe_main(base_url, float(seconds)))))
        return
    from kvrepro.engines.live.placement import autogroup_enabled
    from kvrepro.engines.live.processes import free_port
    from kvrepro.engines.live.server import VllmServer
    from kvrepro.engines.live.tiers import live_tier
    from kvrepro.tier_spec import load_server, override_server

    spec = override_server(load_server(args.server), {"live.port": free_port()})
    tier = live_tier(spec, "small-kv")
    print(f"sched_autogroup_enabled: {autogroup_enabled()}; client CPUs "
          f"{sorted(tier.placement.cpus('client') or [])}; {args.rounds} rounds of "
          f"{args.seconds:g} s per condition")
    results: dict[str, list[dict[str, float]]] = {"same session": [], "own session": []}
    with tempfile.TemporaryDirectory() as folder, VllmServer(tier, Path(folder)) as server:
        server.wait_healthy()
        for _ in range(args.rounds):
            for name in results:
                row = _probe(server.base_url, args.seconds, name == "own session",
                             tier.placement.cpus("client"))
                results[name].append(row)
                print(f"  {name:13s} " + "  ".join(f"{k} {v:.3g}" for k, v in row.items()))
    print("medians:")
    for name, rows in results.items():
        print(f"  {name:13s} " + "  ".join(f"{k} {statistics.median(r[k] for r in rows):.3g}"
                                           for k in rows[0]))


if __name__ == "__main__":
    main()
