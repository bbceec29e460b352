"""A direct probe of a deployed tier: is a prompt evicted from the engine served from LMCache,
and how fast compared with computing it again?

Why separate from the load client: the answer needs requests one at a time on an idle server
(the TTFT of a load, not of a queue), with prompts chosen so that each one is evicted from
the engine's own KV before it is sent again: `n_prompts` x `prompt_tokens` must exceed the
engine's KV budget (the tiny server's 12,288 tokens: four prompts of 7,600).
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
from typing import Any

import pandas as pd

from kvrepro.engines.live.metrics import parse_metrics

PROBE_COLUMNS = ("prompt", "cold_s", "cold_cached_tokens", "hit_s", "hit_cached_tokens",
                 "hit_over_cold")


def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy


def random_prompts(n: int, tokens: int, seed: int) -> list[list[int]]:
    """`n` prompts of `tokens` random token ids that share no prefix (seeded)."""
    rng = random.Random(seed)
    return [[rng.randrange(100, 30000) for _ in range(tokens)] for _ in range(n)]


def complete_once(base_url: str, model: str, prompt: list[int] | str,
                  timeout_s: float = 120.0) -> tuple[float, dict[str, Any]]:
    """(seconds until a 1-token completion of `prompt`, token ids or text, is back; the
    usage the server reports)."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1}).encode()
    request = urllib.request.Request(f"{base_url}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    started = time.perf_counter()
    with _opener().open(request, timeout=timeout_s) as response:
        usage = json.load(response)["usage"]
    return time.perf_counter() - started, usage


def cached_tokens(usage: dict[str, Any]) -> int:
    """Cached prompt tokens of a usage record (0 when the server gives none)."""
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def send(base_url: str, model: str, prompt: list[int], timeout_s: float = 120.0
         ) -> tuple[float, int]:
    """(seconds until the 1-token answer is back, cached prompt tokens the server reports)."""
    took_s, usage = complete_once(base_url, model, prompt, timeout_s)
    return took_s, cached_tokens(usage)


def metrics(url: str) -> dict[str, Any]:
    """One parsed `/metrics` scrape of a vLLM or LMCache server."""
    with _opener().open(f"{url}/metrics", timeout=10) as response:
        return parse_metrics(response.read().decode())


def evicted_hit_probe(base_url: str, model: str, n_prompts: int = 4,
                      prompt_tokens: int = 7600, seed: int = 0) -> pd.DataFrame:
    """Each prompt once cold, then each again after the others evicted it from the engine.

    One row per prompt (`PROBE_COLUMNS`); `hit_over_cold` is the second TTFT over the first,
    the offload-hit / recompute ratio when the second one came from the offload tier
    (`hit_cached_tokens` says how much did).
    """
    prompts = random_prompts(n_prompts, prompt_tokens, seed)
    cold = [send(base_url, model, p) for p in prompts]
    hit = [send(base_url, model, p) for p in prompts]
    rows = [{"prompt": i, "cold_s": c[0], "cold_cached_tokens": c[1], "hit_s": h[0],
             "hit_cached_tokens": h[1], "hit_over_cold": h[0] / c[0]}
            for i, (c, h) in enumerate(zip(cold, hit, strict=True))]
    return pd.DataFrame(rows, columns=list(PROBE_COLUMNS))
