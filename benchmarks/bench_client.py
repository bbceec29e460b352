"""How much the live load client costs per request, and how many requests/s it sustains.

Usage: .venv/bin/python benchmarks/bench_client.py [--sessions 256] [--turns 20]
       [--one-turn-sessions 5000] [--one-turn-in-flight 64] [--repeats 3]

A stand-in for vLLM runs in a subprocess (aiohttp, its own core when there are two): it
answers every `/v1/completions` request at once with a vLLM-shaped stream (first chunk echoes
`prompt_token_ids`, 16 tokens in 4 chunks, a usage chunk, `[DONE]`) and times its own handler,
from entry (before reading the body) to after writing `[DONE]`.

Two phases, two measures:

1. Overhead: one request at a time, so nothing queues: 300 one-turn sessions of 1,000-token
   prompts 10 ms apart, then one 300-turn session (context growing to ~35K tokens).
   Client overhead per request = median(client latency finish_s - send_s) - median(server
   handler time). What remains is the client's own work inside the request (JSON-encoding the
   prompt, parsing the stream, the record) plus loopback TCP and aiohttp's server-side HTTP
   parsing, so it is an upper bound on the client's share.
2. Throughput: `--sessions` sessions of `--turns` turns with no pauses, all started at once
   (closed loop). Prints requests/s over the run and the client's CPU seconds per request
   (process time / requests; includes building each next prompt with `Workload.prompt_ids`),
   and the server's, to show which side limits the rate. Both sides are single-threaded
   Python event loops.
3. Set-up cost: `--one-turn-sessions` one-turn sessions, all due at once, at most
   `--one-turn-in-flight` requests in flight (a steady stream, so sends and replies
   interleave as in a long run). Prints the client's CPU per request over the whole run
   (planning, building every first prompt, which the client does before its first send, and
   all requests) next to its steady-state CPU per request (process time between the records
   at 1/4 and 3/4 of the run over the records between them), medians of `--repeats` runs.
   Set-up that grows faster than the run (a scan of the turns table per prompt cost 7.5 s of
   CPU for 5,000 sessions) shows as whole-run far above steady state.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from aiohttp import web

from kvrepro.engines.live.client import ClientConfig, ClientStats, run_workload
from kvrepro.records import RunWriter, read_run
from kvrepro.workload.base import TURN_COLUMNS, SeededTokens, Workload

TOKENS_PER_CHUNK = 4


# --------------------------------------------------------------------------- server process


def serve(port: int) -> None:
    """The stand-in server (runs in the subprocess until killed)."""
    handler_s: list[float] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        start = time.perf_counter()
        body = await request.json()
        prompt, n = body["prompt"], body["max_tokens"]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        out = [100 + j for j in range(n)]
        for i in range(0, n, TOKENS_PER_CHUNK):
            ids = out[i:i + TOKENS_PER_CHUNK]
            choice = {"index": 0, "text": " t" * len(ids), "token_ids": ids,
                      "prompt_token_ids": prompt if i == 0 else None}
            await resp.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        usage = {"prompt_tokens": len(prompt), "completion_tokens": n,
                 "prompt_tokens_details": {"cached_tokens": 0}}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode()
                         + b"\n\ndata: [DONE]\n\n")
        handler_s.append(time.perf_counter() - start)
        return resp

    async def stats(request: web.Request) -> web.Response:
        result = {"n": len(handler_s), "cpu_s": time.process_time(),
                  "median_handler_s": statistics.median(handler_s) if handler_s else None}
        if request.method == "POST":
            handler_s.clear()
        return web.json_response(result)

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_route("*", "/stats", stats)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


# --------------------------------------------------------------------------- client side


def bench_workload(sessions: int, turns: int, append: int = 100, output: int = 16,
                   gap_s: float = 0.0) -> Workload:
    """`sessions` x `turns` back-to-back turns, session i starting at i * `gap_s`."""
    rows = [(s, t, 0.0, s * gap_s if t == 0 else np.nan, append, output,
             append * (t + 1) + output * t, False, "tool", "short")
            for s in range(sessions) for t in range(turns)]
    table = pd.DataFrame(rows, columns=list(TURN_COLUMNS)).astype(TURN_COLUMNS)
    frame = pd.DataFrame({"session_id": range(sessions), "arrival_s": np.arange(sessions) * gap_s,
                          "n_turns": turns, "cohort": "normal", "is_warmup": False,
                          "end_reason": "cap"})
    return Workload({"kind": "bench"}, frame, table, SeededTokens(seed=1))


async def server_stats(session_url: str, reset: bool = False) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        method = http.post if reset else http.get
        async with method(session_url + "/stats") as resp:
            return await resp.json()


async def phase(url: str, workload: Workload, run_dir: Path) -> tuple[ClientStats, float, dict]:
    """One client run; its stats, client CPU seconds, and the server's stats for it."""
    await server_stats(url, reset=True)
    config = ClientConfig(base_url=url, model="bench", tier="bench", max_connections=4096)
    cpu_start = time.process_time()
    with RunWriter(run_dir, {"engine": "live", "tier": "bench"}) as writer:
        stats = await run_workload(workload, writer, config)
    return stats, time.process_time() - cpu_start, await server_stats(url)


async def one_turn_cpu(url: str, sessions: int, in_flight: int, run_dir: Path
                       ) -> tuple[float, float, ClientStats]:
    """Client CPU seconds per request for `sessions` one-turn sessions due at once: over the
    whole run, and in steady state (between the records at 1/4 and 3/4 of the run)."""
    workload = bench_workload(sessions, 1)
    config = ClientConfig(base_url=url, model="bench", tier="bench", max_in_flight=in_flight)
    marks_s: list[float] = []  # process time as each record is written
    cpu_start = time.process_time()
    with RunWriter(run_dir, {"engine": "live", "tier": "bench"}) as writer:
        stats = await run_workload(workload, writer, config,
                                   on_record=lambda record: marks_s.append(time.process_time()))
    whole_s = (time.process_time() - cpu_start) / max(len(marks_s), 1)
    lo, hi = len(marks_s) // 4, len(marks_s) * 3 // 4
    steady_s = (marks_s[hi] - marks_s[lo]) / (hi - lo) if hi > lo else float("nan")
    return whole_s, steady_s, stats


async def set_up_cost(url: str, sessions: int, in_flight: int, repeats: int, tmp: Path) -> None:
    """Print whole-run and steady-state client CPU per request (medians of `repeats`)."""
    runs = [await one_turn_cpu(url, sessions, in_flight, tmp / f"one_turn_{i}")
            for i in range(repeats)]
    whole_ms = statistics.median(r[0] for r in runs) * 1e3
    steady_ms = statistics.median(r[1] for r in runs) * 1e3
    failed = sum(r[2].requests_failed for r in runs)
    print(f"set-up cost: {sessions} one-turn sessions due at once, at most {in_flight} in "
          f"flight, medians of {repeats} runs ({failed} requests failed in all)\n"
          f"  client CPU per request: whole run {whole_ms:.3f} ms, steady state "
          f"{steady_ms:.3f} ms, ratio {whole_ms / steady_ms:.2f} "
          f"(runs: {', '.join(f'{r[0] * 1e3:.3f}/{r[1] * 1e3:.3f}' for r in runs)} ms)")


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("benchmark server did not start")


async def overhead(url: str, name: str, workload: Workload, run_dir: Path) -> float:
    """Print one overhead measurement; the server's CPU seconds so far."""
    stats, _, server = await phase(url, workload, run_dir)
    records = read_run(run_dir).records
    latency_ms = float((records.finish_s - records.send_s).median() * 1e3)
    handler_ms = server["median_handler_s"] * 1e3
    print(f"overhead, {name}: {stats.requests_ok} requests one at a time "
          f"({stats.requests_failed} failed), median prompt {records.prompt_tokens.median():.0f}"
          f" tokens\n  median client latency {latency_ms:.3f} ms - server handler "
          f"{handler_ms:.3f} ms = client overhead {latency_ms - handler_ms:.3f} ms per request")
    return server["cpu_s"]


async def main_async(args: argparse.Namespace, url: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await overhead(url, "short prompts", bench_workload(args.overhead_requests, 1,
                                                            append=1000, gap_s=0.01),
                       Path(tmp) / "short")
        server_cpu0 = await overhead(url, "growing context",
                                     bench_workload(1, args.overhead_requests),
                                     Path(tmp) / "long")
        workload = bench_workload(args.sessions, args.turns)
        stats, cpu_s, server = await phase(url, workload, Path(tmp) / "throughput")
        n = stats.requests_ok + stats.requests_failed
        print(f"throughput: {args.sessions} concurrent sessions x {args.turns} turns, no pauses, "
              f"{n} requests ({stats.requests_failed} failed) in {stats.elapsed_s:.2f} s")
        print(f"  sustained rate {n / stats.elapsed_s:.0f} requests/s; client CPU "
              f"{cpu_s / n * 1e3:.3f} ms/request, server CPU "
              f"{(server['cpu_s'] - server_cpu0) / n * 1e3:.3f} ms/request; "
              f"max send lag {stats.max_send_lag_s * 1e3:.1f} ms")
        await set_up_cost(url, args.one_turn_sessions, args.one_turn_in_flight, args.repeats,
                          Path(tmp))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--overhead-requests", type=int, default=300)
    parser.add_argument("--one-turn-sessions", type=int, default=5000)
    parser.add_argument("--one-turn-in-flight", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    print(f"cores: {os.cpu_count()} (usable by this process: {len(os.sched_getaffinity(0))})")
    proc, url = start_server()
    try:
        asyncio.run(main_async(args, url))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
