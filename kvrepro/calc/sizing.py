"""KV capacity sizing: how much memory or flash a cache tier needs to hold a TTL of traffic.

Study A's rule (figure A6): KV space = token throughput x TTL x KV bytes per token. Every token
the server processes within the TTL window must still be cached when its session returns.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from kvrepro._checks import positive
from kvrepro.model_spec import ModelSpec, get_model

DEFAULT_TTLS_S: tuple[float, ...] = (300.0, 3600.0)


def kv_capacity(token_rate_tok_s: float, ttl_s: float,
                kv_bytes_per_token: float) -> dict[str, float]:
    """Tokens and bytes a tier must hold to keep `ttl_s` seconds of traffic cached."""
    positive(token_rate_tok_s=token_rate_tok_s, ttl_s=ttl_s, kv_bytes_per_token=kv_bytes_per_token)
    tokens = token_rate_tok_s * ttl_s
    return {"tokens": tokens, "kv_bytes": tokens * kv_bytes_per_token}


def capacity_grid(model: str | ModelSpec, token_rates_tok_s: Sequence[float],
                  ttls_s: Sequence[float] = DEFAULT_TTLS_S) -> pd.DataFrame:
    """Tidy table of capacity needed for every (rate, TTL) pair, one row each."""
    spec = get_model(model) if isinstance(model, str) else model
    if not token_rates_tok_s:
        raise ValueError("parameter 'token_rates_tok_s' is empty")
    if not ttls_s:
        raise ValueError("parameter 'ttls_s' is empty")
    rows = []
    for rate in token_rates_tok_s:
        for ttl in ttls_s:
            held = kv_capacity(rate, ttl, spec.kv_bytes_per_token)
            rows.append({"model": spec.name, "token_rate_tok_s": float(rate), "ttl_s": float(ttl),
                         "tokens": held["tokens"], "kv_bytes": held["kv_bytes"]})
    return pd.DataFrame(rows)


def capacity_vs_ttl(model: str | ModelSpec, token_rates_tok_s: Sequence[float],
                    max_ttl_s: float = 7200.0, points: int = 121) -> pd.DataFrame:
    """Capacity as a continuous function of TTL (for the A6 curves), one row per point."""
    if points < 2:
        raise ValueError(f"parameter 'points' must be >= 2, got {points}")
    positive(max_ttl_s=max_ttl_s)
    ttls = [max_ttl_s * i / (points - 1) for i in range(1, points)]
    return capacity_grid(model, token_rates_tok_s, ttls)


def bandwidth_headroom(array_bw_bytes_s: float, peak_kv_traffic_bytes_s: float) -> float:
    """How many times the tier's bandwidth exceeds the peak KV traffic it must carry."""
    positive(array_bw_bytes_s=array_bw_bytes_s, peak_kv_traffic_bytes_s=peak_kv_traffic_bytes_s)
    return array_bw_bytes_s / peak_kv_traffic_bytes_s


def headroom_table(array_bw_bytes_s: float, traffic_bytes_s: dict[str, float]) -> pd.DataFrame:
    """Tidy bandwidth demand vs capability (figure A8): one row per traffic kind + the array."""
    if not traffic_bytes_s:
        raise ValueError("parameter 'traffic_bytes_s' is empty")
    rows = [{"what": kind, "kind": "KV traffic", "bw_bytes_s": float(bw),
             "headroom": bandwidth_headroom(array_bw_bytes_s, bw)}
            for kind, bw in traffic_bytes_s.items()]
    rows.append({"what": "array (fio)", "kind": "capability", "bw_bytes_s": float(array_bw_bytes_s),
                 "headroom": 1.0})
    return pd.DataFrame(rows)
