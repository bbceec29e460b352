"""Which probe, timed before a run, foresees the machine's decode step of the hour?

Why: the same live command recorded at other hours ran its lone decode steps 2.3-4.8 ms
(the baseline's median per run, 35 runs, 2026-12-02 to 12-06), and a twin fitted at one hour
carries that hour's machine into its predictions (notebook 06). Every live run records
`placement.speed_probe` before and after it (pure-Python work on each CPU), but over those 35
runs its CPU time on the engine CPU before the run ranks with the run's decode step at
Spearman 0.09 (0.18 and 0.16 on the DRAM and flash tiers' 35 each): the CPU's own speed
hardly moved (the probe's median 29.8 ms, most runs 27.5-31) while the step doubled. The
tiny model's decode step reads its 16 MB output layer every token, so memory bandwidth and a
cache shared with other tenants may be what moves. This script puts three probes next to
the live decode step, over and over on one server, to see which one moves with it.

First it prints that ranking from the shipped runs (`--recorded-only` stops there): per tier,
over every single-server run under data/live with a probe, the Spearman correlation of its
lone decode step (`validate.lone_decode_step_ms`) with the probe's CPU time on each CPU, before
and after the run. Then it deploys the spec's small-kv tier once (pinned as the spec says)
and, each round, with the server idle, times on the engine CPU: the package's Python probe
(`speed_probe`), a 64 MiB memory copy (numpy) and the tiny model's output layer as one
token's matrix-vector product (torch, one thread, bf16); then, from the client CPU, the
server's decode step: a 64-token prompt answered with 2 and with 130 tokens (`ignore_eos`),
the difference over 128 steps, median of three pairs. Prints every round, then per probe
its range and its Spearman rank correlation with the decode step over the rounds.

    python benchmarks/bench_probe_vs_step.py [--minutes 15] [--recorded-only]

Measured 2026-12-06 08:55-09:15 UTC (`--minutes 20`, 1175 rounds, a quiet hour): the decode
step 2.00-2.31 ms (median 2.08), the Python probe 23.6-30.2 ms (median 25.0, faster than
before any shipped run), and their ranks went together at Spearman 0.60; the output layer
0.67, the memory copy -0.26. So the Python probe does follow the CPU's speed from second to
second, but the shipped runs' twofold spread of the decode step between hours did not show
in it: what doubled the step between hours is not the CPU's clock. Whether the output-layer
probe would have foreseen those hours is open: no shipped run recorded it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from kvrepro.engines.live.placement import pinned_client, speed_probe
from kvrepro.engines.live.server import VllmServer
from kvrepro.engines.live.tiers import load_tiers

ROOT = Path(__file__).resolve().parents[1]
COPY_BYTES = 64 * 2**20
VOCAB, HIDDEN = 32000, 256  # the tiny model's output layer (data/servers/cpu_tiny.yaml)
PROMPT_TOKENS, SHORT, LONG = 64, 2, 130


def _copy_gb_s(src: np.ndarray, dst: np.ndarray, repeats: int = 5) -> float:
    """Median GB/s of copying `src` into `dst` (read + write bytes)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return 2 * src.nbytes / statistics.median(times) / 1e9


def _linear_us(weight: torch.Tensor, x: torch.Tensor, repeats: int = 20) -> float:
    """Median microseconds of one token through the output layer."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.nn.functional.linear(x, weight)
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def _complete_s(url: str, prompt: list[int], max_tokens: int) -> float:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                       "ignore_eos": True, "temperature": 0}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    start = time.perf_counter()
    with opener.open(request, timeout=120) as response:
        json.load(response)
    return time.perf_counter() - start


def _decode_step_ms(url: str, rng: random.Random, pairs: int = 3) -> float:
    """Median over `pairs` prompts of (time for LONG tokens - time for SHORT) per step."""
    steps = []
    for _ in range(pairs):
        prompt = [rng.randrange(100, 30000) for _ in range(PROMPT_TOKENS)]
        short_s = _complete_s(url, prompt, SHORT)  # its prefill is cached for the long one
        long_s = _complete_s(url, prompt, LONG)
        steps.append(1e3 * (long_s - short_s) / (LONG - SHORT))
    return statistics.median(steps)


def recorded_probes() -> pd.DataFrame:
    """Per shipped single-server run with a speed probe: its tier, lone decode step (ms) and
    the probe's CPU time per CPU before and after it (ms)."""
    from kvrepro.calibration.validate import LIVE_TIERS, lone_decode_step_ms
    from kvrepro.records import read_run

    rows = []
    for meta in sorted((ROOT / "data" / "live").rglob("meta.json")):
        if meta.parent.name not in LIVE_TIERS:
            continue
        run = read_run(meta.parent)
        probe = run.meta.get("speed_probe", {})
        if "after" not in probe:
            continue
        rows.append({"tier": meta.parent.name, "decode_step_ms": lone_decode_step_ms(run),
                     **{f"{when}_{cpu.removesuffix('_cpu_s')}_ms": 1e3 * seconds
                        for when, by_cpu in probe.items() for cpu, seconds in by_cpu.items()
                        if cpu.endswith("_cpu_s")}})
    return pd.DataFrame(rows)


def print_recorded() -> None:
    table = recorded_probes()
    print("Shipped runs: Spearman rank correlation of the lone decode step with the probe")
    by_tier = {tier: part.drop(columns="tier").corr(method="spearman")["decode_step_ms"]
               .drop("decode_step_ms") for tier, part in table.groupby("tier")}
    out = pd.DataFrame(by_tier)
    out.loc["runs"] = table.groupby("tier").size()
    print(out.round(2).to_string())
    print(table.drop(columns="tier").describe().loc[["min", "50%", "max"]].round(2)
          .to_string(), "\n", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--recorded-only", action="store_true",
                        help="only the shipped runs' ranking; deploy nothing")
    args = parser.parse_args()
    print_recorded()
    if args.recorded_only:
        return
    torch.set_num_threads(1)
    tier = load_tiers(ROOT / "data" / "servers" / "cpu_tiny.yaml")["small-kv"]
    engine, client = tier.placement.cpus("engine"), tier.placement.cpus("client")
    src = np.ones(COPY_BYTES // 4, dtype=np.float32)
    dst = np.empty_like(src)
    weight = torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16)
    x = torch.randn(1, HIDDEN, dtype=torch.bfloat16)
    rng, rows = random.Random(0), []
    with tempfile.TemporaryDirectory() as tmp, VllmServer(tier, Path(tmp)) as server:
        server.wait_healthy()
        with pinned_client(client):
            _decode_step_ms(server.base_url, rng)  # warm-up
        deadline = time.monotonic() + 60 * args.minutes
        while time.monotonic() < deadline:
            python_ms = 1e3 * speed_probe(engine, repeats=3)[f"cpu{min(engine)}_cpu_s"]
            with pinned_client(engine):
                copy_gb_s, linear_us = _copy_gb_s(src, dst), _linear_us(weight, x)
            with pinned_client(client):
                step_ms = _decode_step_ms(server.base_url, rng)
            rows.append({"python_probe_ms": python_ms, "copy_gb_s": copy_gb_s,
                         "output_layer_us": linear_us, "decode_step_ms": step_ms})
            print(" ".join(f"{k} {v:.3f}" for k, v in rows[-1].items()), flush=True)
    table = pd.DataFrame(rows)
    print(f"\n{len(table)} rounds over {args.minutes:g} min")
    print(table.describe().loc[["min", "50%", "max"]].round(3).to_string())
    print("Spearman rank correlation with the decode step:")
    print(table.corr(method="spearman")["decode_step_ms"].drop("decode_step_ms").round(2)
          .to_string())


if __name__ == "__main__":
    main()
