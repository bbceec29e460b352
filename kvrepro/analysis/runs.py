"""From request records to the studies' curves and headline numbers, whatever the engine.

Every function here takes the tidy records frame of `kvrepro.records` (one row per request,
`RECORD_COLUMNS` plus `ttft_s`; several tiers' runs concatenated, told apart by `tier`) or a
frame another function here returned. Nothing reads files and nothing knows whether a live
vLLM server or the simulator produced the records, so a figure of a simulated run works
unchanged on a GPU run.

Rules, stated once because every curve and headline depends on them:

* Failed requests (`error != ""`, or no first token) count no tokens anywhere; they are
  only counted as failures where a function says so.
* Throughput attribution: a request's prompt tokens (cached ones included, as study A counts
  them: its tens of thousands of tok/s are mostly the offload layer's delivery rate) count in
  the bin of its `first_token_s`, when prefill is done. Its output tokens are spread uniformly
  over [`first_token_s`, `finish_s`] and split across bins by overlap; a request with
  `first_token_s == finish_s` puts them all in that bin. Bins are [i*bin_s, (i+1)*bin_s) from
  0 to the run end (`run_s`, or the latest `finish_s`, rounded up to whole bins; a token at
  exactly the run end counts in the last bin). Tokens before 0 or after `run_s` are not
  counted. Rates are tokens / `bin_s`, so a last bin that reaches past `run_s` reads low
  (never high: a short last bin divided by its own width would turn one late prefill into a
  spurious peak).
* Cached prompt tokens are what the server reported. A request whose count is unknown (NaN)
  makes its bin's cached and computed rates NaN rather than guessing.
* Smoothing (headline functions, `smooth_bins` > 1): a centred rolling median (or mean) over
  `smooth_bins` bins per tier, with partial windows at the ends (use an odd `smooth_bins`).
  It is applied to the binned rates before taking peaks, plateaus, ratios or crossovers, so
  one noisy minute does not become a headline. Study A bins and smooths its curves in one
  place, with these functions (its settings and headline ids live with the studies,
  `study_a_headlines`): the figures draw what it returns and its headlines read the same
  frame.
* Windows select bins by their centre (`window_bins`: a bin is in [t0, t1] when its centre
  is). The *late window* of a run lasting `run_s` is its last third, [2/3 run_s, run_s]
  (`late_window`, `late_bins`): plateaus default to it, and study A reads its "after
  saturation" levels there.
* A store's fill time is when it first evicted (or, keeping what it holds when full, first
  refused) a chunk; `fill_time_s` says what it reads that from.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from kvrepro._checks import non_negative, positive, require_columns
from kvrepro.records import warn_unfinished

RATE_COLUMNS = ("total_tok_s", "output_tok_s", "prompt_tok_s", "cached_prompt_tok_s",
                "computed_prompt_tok_s")
THROUGHPUT_NEEDS = ["tier", "first_token_s", "finish_s", "prompt_tokens",
                     "cached_prompt_tokens", "output_tokens", "error"]
_TTFT_NEEDS = ["tier", "send_s", "first_token_s", "error"]
_SMOOTH_HOWS = ("median", "mean")
TTFT_COLUMNS = ("tier", "bin_start_s", "bin_end_s", "n", "n_failed", "ttft_median_s",
                "ttft_p90_s", "ttft_p99_s")
SPLIT_COLUMNS = ("tier", "n_requests", "prompt_tokens", "cached_prompt_tokens",
                 "computed_prompt_tokens", "hit_share", "n_cached_unknown")
RESUME_COLUMNS = ("tier", "n_normal", "normal_ttft_median_s", "n_resumes", "n_resumes_failed",
                  "resume_ttft_median_s", "resume_ttft_max_s")


# ---------------------------------------------------------------- input checks and helpers

def succeeded(records: pd.DataFrame) -> pd.Series:
    """Boolean mask of requests that produced a first token without an error."""
    error = records["error"].fillna("").astype(str)
    return (error == "") & records["first_token_s"].notna()


def request_ttft_s(records: pd.DataFrame) -> pd.Series:
    """TTFT from the times themselves, so hand-built frames need not carry `ttft_s`."""
    return records["first_token_s"] - records["send_s"]


def decode_step_s(records: pd.DataFrame) -> pd.Series:
    """Each answer's mean gap between tokens at the client: the time from its first to its
    last token over the steps between them (its mean decode step where the stream flows)."""
    return (records["finish_s"] - records["first_token_s"]) / (records["output_tokens"] - 1)


def _tiers(df: pd.DataFrame) -> list[str]:
    """Tiers in order of first appearance (the order runs were concatenated in)."""
    return list(dict.fromkeys(df["tier"]))


def _bin_edges(run_end_s: float, bin_s: float) -> np.ndarray:
    """Edges 0, bin_s, ... covering [0, run_end_s]; at least one bin."""
    n_bins = max(1, math.ceil(run_end_s / bin_s - 1e-9))
    return np.arange(n_bins + 1) * float(bin_s)


def _run_end_s(times: pd.Series, run_s: float | None, what: str) -> float:
    if run_s is not None:
        positive(run_s=run_s)
        return float(run_s)
    finite = times[np.isfinite(times.to_numpy(dtype=float))]
    if finite.empty:
        raise ValueError(f"{what}: no finite times to end the run at; pass run_s")
    return max(float(finite.max()), 0.0)


def _point_counts(times_s: np.ndarray, amounts: np.ndarray, edges: np.ndarray,
                  run_end_s: float) -> np.ndarray:
    """Sum `amounts` into the bin holding each time (NaN amounts make their bin NaN)."""
    n_bins = len(edges) - 1
    keep = (times_s >= 0) & (times_s <= run_end_s)
    index = np.minimum((times_s[keep] // (edges[1] - edges[0])).astype(int), n_bins - 1)
    return np.bincount(index, weights=amounts[keep], minlength=n_bins).astype(float)


def _spread_uniform(start_s: np.ndarray, end_s: np.ndarray, amounts: np.ndarray,
                    edges: np.ndarray, run_end_s: float) -> np.ndarray:
    """Per-bin share of amounts spread uniformly over [start, end] (zero length: a point).

    Works on the cumulative delivered amount (piecewise linear between start/end events), so
    it costs O(n log n) however fine the bins, instead of an n x bins overlap matrix.
    """
    point = end_s <= start_s
    per_bin = _point_counts(start_s[point], amounts[point], edges, run_end_s)
    start_s, end_s, amounts = start_s[~point], end_s[~point], amounts[~point]
    if len(start_s):
        rate = amounts / (end_s - start_s)
        times = np.concatenate([start_s, end_s])
        order = np.argsort(times, kind="stable")
        times, level = times[order], np.cumsum(np.concatenate([rate, -rate])[order])
        area = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(times))])
        per_bin += np.diff(np.interp(np.minimum(edges, run_end_s), times, area))
    return per_bin


# ---------------------------------------------------------------- curves

def _tier_throughput(ok: pd.DataFrame, tier: str, edges: np.ndarray,
                     run_end_s: float) -> pd.DataFrame:
    bin_s = edges[1] - edges[0]
    first_s = ok["first_token_s"].to_numpy(dtype=float)
    prompt = _point_counts(first_s, ok["prompt_tokens"].to_numpy(dtype=float), edges,
                           run_end_s)
    cached = _point_counts(first_s, ok["cached_prompt_tokens"].to_numpy(dtype=float), edges,
                           run_end_s)
    output = _spread_uniform(first_s, ok["finish_s"].to_numpy(dtype=float),
                             ok["output_tokens"].to_numpy(dtype=float), edges, run_end_s)
    return pd.DataFrame({
        "tier": tier, "bin_start_s": edges[:-1], "bin_end_s": edges[1:],
        "total_tok_s": (prompt + output) / bin_s, "output_tok_s": output / bin_s,
        "prompt_tok_s": prompt / bin_s, "cached_prompt_tok_s": cached / bin_s,
        "computed_prompt_tok_s": (prompt - cached) / bin_s})


def throughput_over_time(records: pd.DataFrame, bin_s: float = 60.0,
                         run_s: float | None = None) -> pd.DataFrame:
    """Token rates per tier and time bin, the curves of study A's figures A2 and A3.

    Returns one row per (tier, bin) with `tier, bin_start_s, bin_end_s, total_tok_s,
    output_tok_s, prompt_tok_s, cached_prompt_tok_s, computed_prompt_tok_s`; empty bins are
    present with 0. Attribution rule and NaN handling: see the module docstring. All tiers
    share the same bins (run end = `run_s` or the latest `finish_s` of any tier), so their
    curves can be compared bin by bin.
    """
    require_columns(records, THROUGHPUT_NEEDS, "throughput_over_time")
    warn_unfinished(records, "throughput_over_time")
    positive(bin_s=bin_s)
    run_end_s = _run_end_s(records["finish_s"], run_s, "throughput_over_time")
    edges = _bin_edges(run_end_s, bin_s)
    ok = records[succeeded(records) & records["finish_s"].notna()]
    frames = [_tier_throughput(ok[ok["tier"] == tier], tier, edges, run_end_s)
              for tier in _tiers(records)]
    if not frames:
        return pd.DataFrame(columns=["tier", "bin_start_s", "bin_end_s", *RATE_COLUMNS])
    return pd.concat(frames, ignore_index=True)


def _tier_ttft(part: pd.DataFrame, tier: str, edges: np.ndarray) -> pd.DataFrame:
    bins = range(len(edges) - 1)
    ok = succeeded(part)
    ttft = request_ttft_s(part)[ok].groupby(part["bin"][ok])
    out = pd.DataFrame({"ttft_median_s": ttft.median(), "ttft_p90_s": ttft.quantile(0.9),
                        "ttft_p99_s": ttft.quantile(0.99)}).reindex(bins)
    out.insert(0, "n_failed", part["bin"][~ok].value_counts().reindex(bins, fill_value=0))
    out.insert(0, "n", ttft.size().reindex(bins, fill_value=0))
    out.insert(0, "bin_end_s", edges[1:])
    out.insert(0, "bin_start_s", edges[:-1])
    out.insert(0, "tier", tier)
    return out.reset_index(drop=True)


def ttft_over_time(records: pd.DataFrame, bin_s: float = 60.0, exclude_warmup: bool = False,
                   run_s: float | None = None) -> pd.DataFrame:
    """TTFT statistics per tier and bin of send time, the curves of figure A4.

    Binning by *send* time shows what a user arriving at that moment experienced. Returns
    `tier, bin_start_s, bin_end_s, n, n_failed, ttft_median_s, ttft_p90_s, ttft_p99_s`;
    statistics cover successful requests only (`n` of them; percentiles interpolate
    linearly) and are NaN in bins without any. Bins run from 0 to `run_s` or the latest send
    time of any tier. `exclude_warmup` drops requests flagged `is_warmup`.
    """
    require_columns(records, _TTFT_NEEDS + (["is_warmup"] if exclude_warmup else []),
                     "ttft_over_time")
    warn_unfinished(records, "ttft_over_time")
    positive(bin_s=bin_s)
    run_end_s = _run_end_s(records["send_s"], run_s, "ttft_over_time")
    edges = _bin_edges(run_end_s, bin_s)
    data = records[~records["is_warmup"].astype(bool)] if exclude_warmup else records
    data = data[(data["send_s"] >= 0) & (data["send_s"] <= run_end_s)]
    data = data.assign(bin=np.minimum((data["send_s"] // bin_s).astype(int), len(edges) - 2))
    frames = [_tier_ttft(data[data["tier"] == tier], tier, edges) for tier in _tiers(records)]
    if not frames:
        return pd.DataFrame(columns=list(TTFT_COLUMNS))
    return pd.concat(frames, ignore_index=True)


def prompt_split(records: pd.DataFrame) -> pd.DataFrame:
    """Per tier: prompt tokens served from cache vs computed, and the cache-hit share.

    Successful requests only. Cached and computed totals (and `hit_share` = cached /
    (cached + computed)) cover the requests whose cached count the server reported; how many
    did not is in `n_cached_unknown`, so one missing count neither erases a tier's share nor
    passes silently. Returns `tier, n_requests, prompt_tokens, cached_prompt_tokens,
    computed_prompt_tokens, hit_share, n_cached_unknown`.
    """
    require_columns(records, THROUGHPUT_NEEDS, "prompt_split")
    warn_unfinished(records, "prompt_split")
    rows = []
    for tier in _tiers(records):
        part = records[(records["tier"] == tier) & succeeded(records)]
        known = part[part["cached_prompt_tokens"].notna()]
        cached = float(known["cached_prompt_tokens"].sum())
        computed = float(known["prompt_tokens"].sum()) - cached
        rows.append({"tier": tier, "n_requests": len(part),
                     "prompt_tokens": int(part["prompt_tokens"].sum()),
                     "cached_prompt_tokens": cached, "computed_prompt_tokens": computed,
                     "hit_share": cached / (cached + computed) if len(known) else math.nan,
                     "n_cached_unknown": len(part) - len(known)})
    return pd.DataFrame(rows, columns=list(SPLIT_COLUMNS))


HIT_MISS_COLUMNS = ("kind", "rule", "n", "median_prompt_tokens", "median_ttft_s")


def _share_in(name: str, value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(f"parameter '{name}' must be a share in [0, 1], got {value!r}")


def hit_miss_ttft(records: pd.DataFrame, min_prompt_tokens: int = 3000,
                  hit_share: float = 0.9, miss_share: float = 0.2) -> pd.DataFrame:
    """TTFT of long prompts served almost wholly from the cache vs almost wholly recomputed.

    What a cache hit buys, measured on the same run: of the successful requests with at
    least `min_prompt_tokens` prompt tokens, a *hit* has a cached share (cached / prompt
    tokens) of at least `hit_share`, a *miss* at most `miss_share`; the others, and requests
    whose cached count is unknown, are neither. Pooled over tiers (a hit is a hit whichever
    tier served it). Returns two rows, hit then miss, with `HIT_MISS_COLUMNS`: `rule` states
    the share rule, `n` the requests, and medians of prompt tokens and TTFT (NaN when `n`
    is 0).
    """
    require_columns(records, ["send_s", "first_token_s", "error", "prompt_tokens",
                              "cached_prompt_tokens"], "hit_miss_ttft")
    warn_unfinished(records, "hit_miss_ttft")
    positive(min_prompt_tokens=min_prompt_tokens)
    _share_in("hit_share", hit_share)
    _share_in("miss_share", miss_share)
    if miss_share >= hit_share:
        raise ValueError(f"parameter 'miss_share' ({miss_share}) must be below 'hit_share' "
                         f"({hit_share}), or a request could be both")
    long = records[succeeded(records) & (records["prompt_tokens"] >= min_prompt_tokens)]
    share = long["cached_prompt_tokens"] / long["prompt_tokens"]
    rows = []
    for kind, rule, chosen in (("hit", f">= {hit_share:.0%} cached", share >= hit_share),
                               ("miss", f"<= {miss_share:.0%} cached", share <= miss_share)):
        part = long[chosen.fillna(False).astype(bool)]
        rows.append({"kind": kind, "rule": rule, "n": len(part),
                     "median_prompt_tokens": part["prompt_tokens"].median(),
                     "median_ttft_s": request_ttft_s(part).median()})
    return pd.DataFrame(rows, columns=list(HIT_MISS_COLUMNS))


SOURCE_COLUMNS = ("tier", "computed_tokens", "engine_hit_tokens", "offload_hit_tokens",
                  "offload_l1_tokens", "offload_l2_tokens", "offload_l2_share")


def _run_increase(data: pd.DataFrame, column: str) -> float:
    """How much a cumulative counter grew over a run (first to last good sample)."""
    if column not in data:
        return float("nan")
    values = data[column].astype("float64").dropna()
    return float(values.iloc[-1] - values.iloc[0]) if len(values) > 1 else float("nan")


def _tier_sources(data: pd.DataFrame, tier: str) -> dict[str, Any]:
    computed = _run_increase(data, "prompt_tokens_local_compute")
    engine = _run_increase(data, "prompt_tokens_local_cache_hit")
    offload = _run_increase(data, "prompt_tokens_external_kv_transfer")
    if np.isnan(engine):  # the simulator's samples: hits by level, queries
        engine = _run_increase(data, "prefix_cache_hits_tokens")
        offload = _run_increase(data, "external_prefix_cache_hits_tokens")
        computed = _run_increase(data, "prompt_tokens") - engine - offload
    l1 = _run_increase(data, "lmcache_l1_hit_tokens")
    l2 = _run_increase(data, "lmcache_l2_hit_tokens")
    l2_share = l2 / (l1 + l2) if l1 + l2 > 0 else float("nan")
    return {"tier": tier, "computed_tokens": computed, "engine_hit_tokens": engine,
            "offload_hit_tokens": offload, "offload_l1_tokens": offload * (1 - l2_share),
            "offload_l2_tokens": offload * l2_share, "offload_l2_share": l2_share}


def prompt_tokens_by_source(samples: pd.DataFrame) -> pd.DataFrame:
    """Where each tier's prompt tokens came from over the run: computed, the engine's own
    prefix cache, or the offload tier, split into LMCache's L1 (DRAM) and L2 (disk).

    From the servers' counters, not the records: live samples carry vLLM's
    `prompt_tokens_by_source` (local_compute / local_cache_hit / external_kv_transfer); the
    simulator's carry prefix and external hits. The L1 / L2 split applies the share of
    LMCache's own lookup hits (`lmcache_l1_hit_tokens`, `lmcache_l2_hit_tokens`) to vLLM's
    offload tokens: LMCache counts hits on every lookup, including prefixes the engine still
    held, so only its ratio is used (NaN without LMCache's counters). One row per tier,
    columns `SOURCE_COLUMNS`.
    """
    require_columns(samples, ["time_s", "tier"], "prompt_tokens_by_source")
    warn_unfinished(samples, "prompt_tokens_by_source")
    good = samples
    if "scrape_error" in samples:
        good = samples[samples["scrape_error"].isna() | (samples["scrape_error"] == "")]
    rows = [_tier_sources(part.sort_values("time_s"), tier)
            for tier, part in good.groupby("tier", sort=False)]
    return pd.DataFrame(rows, columns=list(SOURCE_COLUMNS))


def resume_stats(records: pd.DataFrame, exclude_warmup: bool = True,
                 common_sessions: bool = False) -> pd.DataFrame:
    """Per tier: normal-turn vs resume TTFT, the numbers of figure A5.

    A resume is the first turn of a session after its long idle; whether its KV survived the
    idle is what the tiers differ in. Returns `tier, n_normal, normal_ttft_median_s,
    n_resumes, n_resumes_failed, resume_ttft_median_s, resume_ttft_max_s`; medians and the
    max cover successful requests, `n_resumes` counts failed resumes too (a failed resume
    has no TTFT, so it cannot be the slowest one, but it must not vanish unseen).

    With `common_sessions`, only the resumes of sessions that resumed in every tier's run
    count, as in study A ("the same 11 sessions resumed in every tier's run"): a fast tier
    gets further through the same workload, and its extra, later resumes would otherwise be
    compared with nothing in the slow tiers.
    """
    require_columns(records, _TTFT_NEEDS + ["is_resume", "session_id"]
                     + (["is_warmup"] if exclude_warmup else []), "resume_stats")
    warn_unfinished(records, "resume_stats")
    data = records[~records["is_warmup"].astype(bool)] if exclude_warmup else records
    if common_sessions:
        data = data[~data["is_resume"].astype(bool)
                    | data["session_id"].isin(common_resume_sessions(data))]
    rows = []
    for tier in _tiers(records):
        part = data[data["tier"] == tier]
        ok, resume = succeeded(part), part["is_resume"].astype(bool)
        ttft = request_ttft_s(part)
        normal, resumed = ttft[ok & ~resume], ttft[ok & resume]
        rows.append({"tier": tier, "n_normal": len(normal),
                     "normal_ttft_median_s": normal.median(), "n_resumes": int(resume.sum()),
                     "n_resumes_failed": int((resume & ~ok).sum()),
                     "resume_ttft_median_s": resumed.median(),
                     "resume_ttft_max_s": resumed.max()})
    return pd.DataFrame(rows, columns=list(RESUME_COLUMNS))


def common_resume_sessions(records: pd.DataFrame) -> set[int]:
    """Sessions whose resume was sent in every tier's run (failed or not)."""
    resumed = records[records["is_resume"].astype(bool)]
    per_tier = [set(part["session_id"]) for _, part in resumed.groupby("tier")]
    if not per_tier or resumed["tier"].nunique() < records["tier"].nunique():
        return set()
    return set.intersection(*per_tier)


# ---------------------------------------------------------------- headline extraction

def smooth_rates(binned: pd.DataFrame, smooth_bins: int = 1, how: str = "median",
                 columns: Iterable[str] | None = None) -> pd.DataFrame:
    """Copy of `binned` with rate columns smoothed per tier (centred rolling window).

    Partial windows at the ends (min_periods=1) keep every bin; `smooth_bins=1` returns an
    unchanged copy. Rows are taken in `bin_start_s` order within each tier.
    """
    if not isinstance(smooth_bins, int | np.integer) or smooth_bins < 1:
        raise ValueError(f"parameter 'smooth_bins' must be an integer >= 1, got {smooth_bins!r}")
    if how not in _SMOOTH_HOWS:
        raise ValueError(f"parameter 'how' must be one of {_SMOOTH_HOWS}, got {how!r}")
    require_columns(binned, ["tier", "bin_start_s"], "smooth_rates")
    out = binned.copy()
    cols = list(columns) if columns is not None else [c for c in RATE_COLUMNS if c in binned]
    if smooth_bins == 1 or not cols:
        return out
    ordered = binned.sort_values("bin_start_s", kind="stable")
    smoothed = ordered.groupby("tier", sort=False)[cols].transform(
        lambda s: getattr(s.rolling(smooth_bins, center=True, min_periods=1), how)())
    out[cols] = smoothed.reindex(out.index)
    return out


def _prepared(binned: pd.DataFrame, column: str, smooth_bins: int, how: str) -> pd.DataFrame:
    require_columns(binned, ["tier", "bin_start_s", "bin_end_s", column], "binned throughput")
    return smooth_rates(binned, smooth_bins, how, [column])


def _wide(binned: pd.DataFrame, column: str, smooth_bins: int, how: str) -> pd.DataFrame:
    """One column per tier, indexed by (bin_start_s, bin_end_s), in time order."""
    data = _prepared(binned, column, smooth_bins, how)
    wide = data.pivot(index=["bin_start_s", "bin_end_s"], columns="tier", values=column)
    return wide.sort_index()[_tiers(data)]


def _need_tiers(wide: pd.DataFrame, *tiers: str) -> None:
    missing = [t for t in tiers if t not in wide.columns]
    if missing:
        raise ValueError(f"tier(s) {missing} not in the data (tiers: {list(wide.columns)})")


def peak(binned: pd.DataFrame, column: str = "total_tok_s", smooth_bins: int = 1,
         how: str = "median") -> pd.DataFrame:
    """Highest (smoothed) rate per tier and when it happened.

    Returns `tier, peak_tok_s, peak_bin_start_s, peak_time_s` (bin centre); ties go to the
    earliest bin.
    """
    data = _prepared(binned, column, smooth_bins, how)
    rows = []
    for tier, part in data.groupby("tier", sort=False):
        at = part.loc[part[column].idxmax()]
        rows.append({"tier": tier, "peak_tok_s": float(at[column]),
                     "peak_bin_start_s": float(at["bin_start_s"]),
                     "peak_time_s": (float(at["bin_start_s"]) + float(at["bin_end_s"])) / 2})
    return pd.DataFrame(rows)


def late_window(run_s: float) -> tuple[float, float]:
    """(t0_s, t1_s) of the late window of a run lasting `run_s`: its last third.

    The one definition of "late in the run" (plateaus, the what-if sweep's late level, the
    notebooks); select its bins with `late_bins` (or `window_bins`), i.e. by their centre.
    """
    positive(run_s=run_s)
    return 2 * run_s / 3, float(run_s)


def window_bins(binned: pd.DataFrame, t0_s: float, t1_s: float) -> pd.DataFrame:
    """The rows of `binned` whose bin centre, (bin_start_s + bin_end_s) / 2, is in [t0_s, t1_s].

    By the centre, so that a bin straddling t0_s counts only when mostly inside.
    """
    require_columns(binned, ["bin_start_s", "bin_end_s"], "window_bins")
    centre_s = (binned["bin_start_s"] + binned["bin_end_s"]) / 2
    return binned[(centre_s >= t0_s) & (centre_s <= t1_s)]


def late_bins(binned: pd.DataFrame, run_s: float | None = None) -> pd.DataFrame:
    """The rows of `binned` in the late window (`late_window`), selected by bin centre.

    `run_s` defaults to the end of the binned run (its last `bin_end_s`).
    """
    require_columns(binned, ["bin_start_s", "bin_end_s"], "late_bins")
    if run_s is None:
        run_s = float(binned["bin_end_s"].max())
    return window_bins(binned, *late_window(run_s))


def _plateau_window_s(binned: pd.DataFrame, t0_s: float | None,
              t1_s: float | None) -> tuple[float, float]:
    """[t0, t1]; a missing end comes from the late window of the binned run."""
    late_t0_s, late_t1_s = late_window(float(binned["bin_end_s"].max()))
    return (late_t0_s if t0_s is None else t0_s, late_t1_s if t1_s is None else t1_s)


def plateau(binned: pd.DataFrame, column: str = "total_tok_s", t0_s: float | None = None,
            t1_s: float | None = None, smooth_bins: int = 1, how: str = "median") -> pd.Series:
    """Mean rate per tier over the bins whose centre lies in [t0_s, t1_s].

    The default window is the late window (`late_window`, the last third of the run): study
    A reads its settled levels ("after saturation", "the second half of the run") there. NaN
    when no bin falls inside.
    """
    data = _prepared(binned, column, smooth_bins, how)
    inside = window_bins(data, *_plateau_window_s(data, t0_s, t1_s))
    means = inside.groupby("tier", sort=False)[column].mean()
    return means.reindex(_tiers(data)).rename(f"{column}_plateau")


def retained_share(binned: pd.DataFrame, column: str = "total_tok_s",
                   t0_s: float | None = None, t1_s: float | None = None,
                   smooth_bins: int = 1, how: str = "median") -> pd.Series:
    """Plateau after saturation as a share (0-1) of the tier's own peak (A2: 42 % / 94 %)."""
    level = plateau(binned, column, t0_s, t1_s, smooth_bins, how)
    top = peak(binned, column, smooth_bins, how).set_index("tier")["peak_tok_s"]
    return (level / top.reindex(level.index)).rename(f"{column}_retained_share")


def gain_over_baseline_at_peak(binned: pd.DataFrame, column: str = "total_tok_s",
                               baseline: str = "baseline", smooth_bins: int = 1,
                               how: str = "median") -> pd.Series:
    """Each non-baseline tier's peak over the baseline's rate in that same bin (A2: 2.9x).

    Comparing in the same bin, not peak to peak, is what study A does: the offload tiers
    peak when the baseline has long plateaued, and the ratio says what offload buys then.
    """
    wide = _wide(binned, column, smooth_bins, how)
    _need_tiers(wide, baseline)
    gains = {}
    for tier in (t for t in wide.columns if t != baseline):
        at = wide[tier].idxmax()
        gains[tier] = wide.at[at, tier] / wide.at[at, baseline]
    return pd.Series(gains, name=f"{column}_gain_over_{baseline}", dtype=float)


def crossover_time_s(binned: pd.DataFrame, a: str, b: str, column: str = "total_tok_s",
                     hold_s: float = 600.0, smooth_bins: int = 1, how: str = "median") -> float:
    """Start of the first stretch of bins, lasting >= `hold_s`, where tier a beats tier b.

    The hold keeps two curves that run within noise of each other (study A's tiers in the
    first ten minutes) from "crossing" at every bin. NaN if no such stretch fits in the run.
    """
    non_negative(hold_s=hold_s)
    wide = _wide(binned, column, smooth_bins, how)
    _need_tiers(wide, a, b)
    above = (wide[a] > wide[b]).to_numpy()
    starts = wide.index.get_level_values("bin_start_s")
    ends = wide.index.get_level_values("bin_end_s")
    first: int | None = None
    for i, is_above in enumerate(above):
        first = (i if first is None else first) if is_above else None
        if first is not None and ends[i] - starts[first] >= hold_s:
            return float(starts[first])
    return math.nan


def early_spread(binned: pd.DataFrame, column: str = "total_tok_s", window_s: float = 600.0,
                 start_s: float = 0.0, smooth_bins: int = 1, how: str = "median") -> float:
    """Largest relative spread between tiers, (max - min) / mean, in the early window.

    Bins lying wholly inside [start_s, start_s + window_s] count; bins where every tier is
    at 0 are skipped. A fraction (A2: all tiers within 0.01 for the first ~10 min).
    """
    positive(window_s=window_s)
    wide = _wide(binned, column, smooth_bins, how)
    starts = wide.index.get_level_values("bin_start_s")
    ends = wide.index.get_level_values("bin_end_s")
    part = wide[(starts >= start_s) & (ends <= start_s + window_s + 1e-9)]
    mean = part.mean(axis=1)
    spread = ((part.max(axis=1) - part.min(axis=1)) / mean)[mean > 0]
    return float(spread.max()) if len(spread) else math.nan


def store_of(column: str) -> str | None:
    """The store a bytes-used column `<store>_bytes_used` belongs to (None: another name)."""
    return column.removesuffix("_bytes_used") if column.endswith("_bytes_used") else None


def _exact_fill_s(stats: Mapping[str, Any], store: str) -> float | None:
    """The earlier of a run's first eviction and first refusal (None: stats lack both)."""
    times = [stats.get(f"{store}_first_eviction_s"), stats.get(f"{store}_first_refusal_s")]
    known = [float(t) for t in times if t is not None]
    if not known:
        return None
    finite = [t for t in known if math.isfinite(t)]
    return min(finite) if finite else math.nan


def fill_counters(data: pd.DataFrame, store: str | None) -> list[str]:
    """The simulator's cumulative eviction / refusal counters of `store` present in `data`."""
    if store is None:
        return []
    names = (f"{store}_evicted_chunks", f"{store}_rejected_chunks")
    return [c for c in names if c in data.columns and data[c].notna().any()]


def capacity_column(data: pd.DataFrame, store: str | None) -> str | None:
    name = f"{store}_capacity_bytes"
    return name if store is not None and name in data.columns and data[name].notna().any() \
        else None


def fill_time_s(samples: pd.DataFrame, column: str, capacity_bytes: float | None = None, *,
                tier: str | None = None, chunk_bytes: float | None = None,
                stats: Mapping[str, Any] | None = None) -> float:
    """When an offload store filled: the time it first evicted a chunk, or, for a store that
    keeps what it holds when full (eviction "none"), first refused one. NaN if it never did.

    The one definition of a tier's fill time (study A's "DRAM full at ~45 min", A2's fill
    marker, the what-if sweeps). `column` is the store's bytes-used column,
    `<store>_bytes_used`; the store's other columns are found by that prefix. `tier`
    selects one tier's samples (samples of several tiers carry a `tier` column, as
    `read_runs` and `simulate_campaign` return them). The time comes from the best evidence
    at hand:

    1. `stats` of one simulated run (`SimResult.stats`, or `meta["stats"]` of its run
       folder) with `<store>_first_eviction_s` / `<store>_first_refusal_s`: exact, the
       earlier of the two;
    2. else the simulator's cumulative counters in the samples, `<store>_evicted_chunks`
       and `<store>_rejected_chunks`: the first sample time at which either is above 0 (the
       exact time rounded up to the next sample);
    3. else, for live runs (vLLM's samples have no eviction counter): the first sample whose
       bytes used reach the store's capacity in whole chunks: `<store>_capacity_bytes` when
       the samples carry it, else `capacity_bytes` rounded down to a multiple of
       `chunk_bytes` (as given when `chunk_bytes` is None). A store holding that much has
       no room for another chunk, so its next write evicts: this is the fill time to within
       that write and the sampling interval.
    """
    require_columns(samples, ["time_s", column] + (["tier"] if tier is not None else []),
                    "fill_time_s")
    store = store_of(column)
    if stats is not None and store is not None:
        exact_s = _exact_fill_s(stats, store)
        if exact_s is not None:
            return exact_s
    data = samples if tier is None else samples[samples["tier"] == tier]
    counters = fill_counters(data, store)
    if counters:
        done = (data[counters].fillna(0) > 0).any(axis=1)
    else:
        column_of_capacity = capacity_column(data, store)
        if column_of_capacity is not None:
            capacity: Any = data[column_of_capacity]
        elif capacity_bytes is not None:
            positive(capacity_bytes=capacity_bytes)
            capacity = float(capacity_bytes)
            if chunk_bytes is not None:
                positive(chunk_bytes=chunk_bytes)
                capacity = capacity // chunk_bytes * chunk_bytes
        else:
            raise ValueError(f"fill_time_s: the samples have no eviction counters or capacity "
                             f"column for {column!r}; pass capacity_bytes")
        done = (capacity > 0) & (data[column] >= capacity)
    times = data.loc[done, "time_s"]
    return float(times.min()) if len(times) else math.nan


PROCESS_SUFFIXES = ("_cpu_user_s", "_cpu_system_s", "_ctx_involuntary", "_runqueue_wait_s",
                    "_runqueue_slices")
"""Endings of the live samples' per-process counters (`engines.live.placement`), in the
order `ProcessAccounting` reads them; `_runqueue_wait_s` only in runs from 2026-12-05,
`_runqueue_slices` from 2026-12-05 06:00 UTC."""


HOST_KEY_PREFIX = "host_cpu"
"""The live samples' host CPU counters: `host_cpu<N>_busy_s` and `host_cpu<N>_steal_s`
(`engines.live.placement.host_cpu_times`), in runs from 2026-12-05 06:00 UTC on."""


def _growth(data: pd.DataFrame, column: str) -> float:
    """How much a cumulative sample column grew from its first to its last reading."""
    values = data[column].dropna() if column in data else pd.Series(dtype=float)
    return float(values.iloc[-1] - values.iloc[0]) if len(values) > 1 else math.nan


def outside_cpu(samples: pd.DataFrame) -> dict[str, float]:
    """CPU seconds per second of the run, all CPUs of the host: `host_busy` (their busy
    time), `run_busy` (the run's processes, `process_cpu`), `outside_busy` (the difference:
    what else ran there, the kernel's own threads included) and `steal_per_s` (time the
    hypervisor gave another guest). Why: a run that met other work on its 2 CPUs is slower
    by that, which no model of the run can predict; NaN in runs without host counters."""
    busy = [c for c in samples.columns if c.startswith(HOST_KEY_PREFIX) and c.endswith("_busy_s")]
    nan = {"host_busy": math.nan, "run_busy": math.nan, "outside_busy": math.nan,
           "steal_per_s": math.nan}
    if not busy or len(samples) < 2:
        return nan
    data = samples.sort_values("time_s")
    elapsed_s = float(data["time_s"].iloc[-1] - data["time_s"].iloc[0])
    host = sum(_growth(data, c) for c in busy) / elapsed_s
    steal = sum(_growth(data, c.replace("_busy_s", "_steal_s")) for c in busy) / elapsed_s
    run = float(process_cpu(samples).cpu_busy.sum())
    return {"host_busy": host, "run_busy": run, "outside_busy": host - run,
            "steal_per_s": steal}


PROCESS_COLUMNS = ("role", "cpu_busy", "ctx_involuntary_per_s", "runqueue_wait_per_s",
                   "slices_per_s", "wait_per_slice_s")


def process_cpu(samples: pd.DataFrame) -> pd.DataFrame:
    """What each process role of a live run did between its first and last sample: CPUs
    busy (user + system seconds per second of the run) and involuntary context switches per
    second (a process the kernel takes off its CPU because another wants it: contention)
    and, where the samples have them (NaN in older runs), its main thread's run queue wait
    per second (runnable, waiting for a CPU), its timeslices per second (how often it ran)
    and its wait per timeslice (how long it waited each time). Columns `PROCESS_COLUMNS`;
    empty for samples without them."""
    roles = sorted({c[len("proc_"):-len("_cpu_user_s")] for c in samples.columns
                    if c.startswith("proc_") and c.endswith("_cpu_user_s")})
    if not roles or len(samples) < 2:
        return pd.DataFrame(columns=list(PROCESS_COLUMNS))
    data = samples.sort_values("time_s")
    elapsed_s = float(data["time_s"].iloc[-1] - data["time_s"].iloc[0])

    def grew(column: str) -> float:
        return _growth(data, column)

    rows = []
    for role in roles:
        wait_s, slices = grew(f"proc_{role}_runqueue_wait_s"), grew(f"proc_{role}_runqueue_slices")
        rows.append({"role": role,
                     "cpu_busy": (grew(f"proc_{role}_cpu_user_s")
                                  + grew(f"proc_{role}_cpu_system_s")) / elapsed_s,
                     "ctx_involuntary_per_s": grew(f"proc_{role}_ctx_involuntary") / elapsed_s,
                     "runqueue_wait_per_s": wait_s / elapsed_s, "slices_per_s": slices / elapsed_s,
                     "wait_per_slice_s": wait_s / slices if slices > 0 else math.nan})
    return pd.DataFrame(rows, columns=list(PROCESS_COLUMNS))


# ---------------------------------------------------------------- a fleet's turns

BURST_S = 1e-3
"""An answer whose tokens reach the client less than this far apart on average came in one
burst: the server held them and sent them together."""


def token_delivery(records: pd.DataFrame, burst_s: float = BURST_S) -> dict[str, float]:
    """How the tokens of the succeeded answers with more than one reached the client: their
    number, the share that came in one burst (`decode_step_s` below `burst_s`) and the
    median and 90th percentile of that mean gap. Why: a stream stalled anywhere between the
    engine and the client's reader delivers many tokens at once, late; the client-side TTFT
    holds that wait, which the engine's own step time does not show. On this machine's
    single-server runs the stalled one was the load client itself, runnable but kept off its
    CPU while the server ran in a session (autogroup) of its own (`engines.live.processes.
    ManagedProcess`)."""
    ok = records[succeeded(records) & (records["output_tokens"] > 1)]
    gap_s = decode_step_s(ok)
    return {"n_answers": int(len(ok)),
            "burst_share": float((gap_s < burst_s).mean()) if len(ok) else math.nan,
            "gap_median_s": float(gap_s.median()), "gap_p90_s": float(gap_s.quantile(0.9))}


def share(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when the denominator is 0 (a share of nothing)."""
    return float(numerator / denominator) if denominator > 0 else math.nan


def window_throughput_tok_s(records: pd.DataFrame, t0_s: float, t1_s: float) -> float:
    """Tokens per second that `records` (succeeded requests) delivered in [t0, t1], by this
    module's attribution rule (prompt tokens at the first token, output tokens spread over
    the decode): one bin of `throughput_over_time` spanning the window."""
    if records.empty:
        return 0.0
    shifted = records.assign(first_token_s=records.first_token_s - t0_s,
                             finish_s=records.finish_s - t0_s, send_s=records.send_s - t0_s,
                             tier="fleet")
    binned = throughput_over_time(shifted, bin_s=t1_s - t0_s, run_s=t1_s - t0_s)
    return float(binned.total_tok_s.iloc[0])


def fleet_turn_stats(turns: pd.DataFrame,
                     hit_columns: Sequence[str] = ("cached_prompt_tokens",)) -> dict[str, Any]:
    """What a fleet's measured turns (succeeded, in its measurement window) say about its
    cache, the same recipe for the twin (`kvrepro.engines.sim.fleet.fleet_headlines`) and a
    live fleet (`kvrepro.analysis.fleet_live.fleet_live_summary`):

    * `ttft_median_s`, `ttft_p90_s`: first_token_s - send_s;
    * `cached_share`: cached prompt tokens / prompt tokens;
    * `routed_away_turns`: turns sent to another instance than their session's previous one;
    * `cross_instance_hit_share`: over those turns, the tokens in `hit_columns` / their
      prompt tokens. The engines differ in what they can see, so it is a parameter: the
      twin counts what offload stores served (`loaded_tokens_<store>`), a live run what its
      answers report cached (`cached_prompt_tokens`, the engine's prefix cache included).

    Which turns are measured (the window) and how throughput is counted are the callers':
    the twin measures [warmup_s, duration_s] and attributes tokens in time
    (`window_throughput_tok_s`); a live fleet measures from its first measured send to its
    last measured finish and counts every measured turn's tokens whole.
    """
    ttft = turns["first_token_s"] - turns["send_s"]
    away = turns[turns["routed_away"].astype(bool)]
    return {"ttft_median_s": float(ttft.median()) if len(turns) else math.nan,
            "ttft_p90_s": float(ttft.quantile(0.9)) if len(turns) else math.nan,
            "cached_share": share(turns["cached_prompt_tokens"].sum(),
                                  turns["prompt_tokens"].sum()),
            "routed_away_turns": len(away),
            "cross_instance_hit_share": share(away[list(hit_columns)].sum().sum(),
                                              away["prompt_tokens"].sum())}
