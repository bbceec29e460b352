"""Server samples from a vLLM server's Prometheus `/metrics`, for the live engine.

Why scrape at all: per-request records say what each request saw (its TTFT, its cached
tokens), but not what the server was doing between requests: how full the KV cache was, how
many requests queued, how many prompt tokens each cache tier supplied. The live engine scrapes
`/metrics` every few seconds during a run and writes one *server sample* per scrape into the
run folder (`samples.jsonl`, see `kvrepro.records`).

* `parse_metrics` turns one scrape into flat, unit-named keys (`prefix_cache_hits_tokens`,
  `kv_cache_usage_frac`, ...). Series are selected by name (`VLLM_SERIES`), summed over the
  labels that only say *where* (`engine`, `model_name`): a data-parallel server counts its
  engines together. Counters stay cumulative, exactly as the server reports them; the analysis
  differences them (`counter_rates`), so a missed scrape loses no events.
* Offload connectors add their own series on GPU machines: vLLM's OffloadingConnector exports
  `vllm:kv_offload_*`, LMCache exports `lmcache:*`. Their names change between releases, so
  they are passed through, flattened with their labels, instead of being renamed here.
* `sample_metrics` is the periodic sampler; a failed scrape becomes a sample with
  `scrape_error` text, because a run must not die because `/metrics` hiccupped once.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from kvrepro._checks import require_columns
from kvrepro.engines.live.placement import is_process_key

# Labels that say which engine/model produced a series, not what it counts: summed over.
SUMMED_LABELS = frozenset({"engine", "model_name", "served_model_name"})
# Series passed through verbatim (flattened) when present: offload connectors on GPU machines.
PASS_THROUGH_PREFIXES = ("vllm:kv_offload_", "lmcache:")
# Passed-through gauges with these endings are fractions: averaged over engines, not summed.
FRACTION_SUFFIXES = ("_perc", "_rate", "_ratio", "_frac")
SCRAPE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Series:
    """One selected vLLM series and the sample key(s) it becomes.

    `names` are exposition sample names, most current first; the first one present wins, so
    a server that exports both a metric and its deprecated alias is not counted twice. With
    `split_label`, each value of that label gets its own key `f"{key}_{value}"`. Series of
    several engines are summed, except fractions (`mean=True`): two data-parallel engines at
    50 % and 25 % KV usage are at 37.5 %, not 75 %.
    """

    key: str
    names: tuple[str, ...]
    cumulative: bool = True
    split_label: str | None = None
    mean: bool = False


def _histogram(key: str, name: str) -> tuple[Series, Series]:
    """Sum (seconds) and count of a latency histogram: enough for interval means."""
    return (Series(f"{key}_sum_s", (f"{name}_sum",)), Series(f"{key}_count", (f"{name}_count",)))


VLLM_SERIES: tuple[Series, ...] = (
    # vLLM < 0.10 called the prefix-cache counters and KV usage `gpu_*`: fallbacks.
    Series("prefix_cache_queries_tokens",
           ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")),
    Series("prefix_cache_hits_tokens",
           ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")),
    Series("external_prefix_cache_queries_tokens", ("vllm:external_prefix_cache_queries_total",)),
    Series("external_prefix_cache_hits_tokens", ("vllm:external_prefix_cache_hits_total",)),
    Series("kv_cache_usage_frac", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
           cumulative=False, mean=True),
    Series("requests_running", ("vllm:num_requests_running",), cumulative=False),
    Series("requests_waiting", ("vllm:num_requests_waiting",), cumulative=False),
    Series("preemptions", ("vllm:num_preemptions_total",)),
    Series("prompt_tokens", ("vllm:prompt_tokens_total",)),
    Series("generation_tokens", ("vllm:generation_tokens_total",)),
    Series("prompt_tokens_cached", ("vllm:prompt_tokens_cached_total",)),
    # source = local_compute / local_cache_hit / external_kv_transfer
    Series("prompt_tokens", ("vllm:prompt_tokens_by_source_total",), split_label="source"),
    # source = device / host / disk / p2p / external_unspecified
    Series("prompt_tokens_cached", ("vllm:prompt_tokens_cached_by_source_total",),
           split_label="source"),
    Series("requests_finished", ("vllm:request_success_total",), split_label="finished_reason"),
    *_histogram("ttft", "vllm:time_to_first_token_seconds"),
    *_histogram("itl", "vllm:inter_token_latency_seconds"),
    *_histogram("e2e_latency", "vllm:e2e_request_latency_seconds"),
    *_histogram("queue_time", "vllm:request_queue_time_seconds"),
    *_histogram("prefill_time", "vllm:request_prefill_time_seconds"),
)
# The multi-process LMCache server's own /metrics (its HTTP API), as lmcache 0.5.6 names them
# (seen on this machine, LMCACHE_CPU.md's setup): lookups and hits per tier (L1 = its DRAM,
# L2 = its disk adapter), chunks written / read / evicted in L1, chunks stored to and loaded
# from L2, and what each tier holds. Counters are tokens or chunks; usage is bytes.
LMCACHE_MP_SERIES: tuple[Series, ...] = (
    Series("lmcache_lookup_tokens", ("lmcache_mp_lookup_requested_tokens_total",)),
    Series("lmcache_hit_tokens", ("lmcache_mp_lookup_hit_tokens_total",)),
    Series("lmcache_l1_hit_tokens", ("lmcache_mp_lookup_hit_l1_tokens_total",)),
    Series("lmcache_l2_hit_tokens", ("lmcache_mp_lookup_hit_l2_tokens_total",)),
    Series("lmcache_l1_write_chunks", ("lmcache_mp_l1_write_chunks_total",)),
    Series("lmcache_l1_read_chunks", ("lmcache_mp_l1_read_chunks_total",)),
    Series("lmcache_l1_evicted_chunks", ("lmcache_mp_l1_evicted_chunks_total",)),
    Series("lmcache_l2_store_chunks", ("lmcache_mp_l2_store_completed_objects_chunks_total",)),
    Series("lmcache_l2_load_chunks", ("lmcache_mp_l2_prefetch_load_completed_chunks_total",)),
    Series("lmcache_l1_bytes_used", ("lmcache_mp_l1_memory_usage_bytes",), cumulative=False),
    Series("lmcache_l1_usage_frac", ("lmcache_mp_l1_usage_ratio",), cumulative=False,
           mean=True),
    Series("lmcache_l2_bytes_used", ("lmcache_mp_l2_usage_bytes",), cumulative=False),
)
ALL_SERIES = VLLM_SERIES + LMCACHE_MP_SERIES
GAUGE_KEYS = frozenset(s.key for s in ALL_SERIES if not s.cumulative)


class SamplerClock(Protocol):
    """The run clock, as `kvrepro.engines.live.client.Clock` defines it (not imported, to keep this
    module free of the client); `now_s` should count seconds since the run start, since it
    becomes the samples' `time_s`, as for the request records."""

    def now_s(self) -> float: ...

    async def sleep_until(self, t_s: float) -> None: ...


class SampleWriter(Protocol):
    """Where samples go: `kvrepro.records.RunWriter` in a run."""

    def write_sample(self, sample: dict[str, Any]) -> None: ...


def _families(text: str) -> list[Any]:
    """Parse exposition text; turn the parser's terse errors into one that says what it was."""
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as err:
        head = text.strip().splitlines()[0][:80] if text.strip() else ""
        raise ValueError(f"not Prometheus text exposition ({err}); "
                         f"it starts with {head!r}") from err


def _samples_by_name(families: Iterable[Any]) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in families:
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, float(sample.value)))
    return out


def _select(series: Series, by_name: dict[str, list[tuple[dict[str, str], float]]],
            out: dict[str, float]) -> None:
    """Add one selected series to `out`, combined over everything but its split label."""
    name = next((n for n in series.names if n in by_name), None)
    if name is None:
        return
    parts: dict[str, list[float]] = {}
    for labels, value in by_name[name]:
        key = series.key
        if series.split_label is not None:
            key = f"{key}_{_clean(labels.get(series.split_label, 'unlabelled'))}"
        parts.setdefault(key, []).append(value)
    out.update({k: _combine(v, series.mean) for k, v in parts.items()})


def _combine(values: list[float], mean: bool) -> float:
    return sum(values) / len(values) if mean else sum(values)


def _clean(text: str) -> str:
    """A label value fit for a column name: anything but [A-Za-z0-9_] becomes '_'."""
    return re.sub(r"\W", "_", text, flags=re.ASCII)


def flat_key(name: str, labels: dict[str, str]) -> str:
    """Flattened name of a passed-through series, e.g.
    `vllm:kv_offload_total_bytes_total{transfer_type="GPU_to_CPU"}` ->
    `vllm_kv_offload_total_bytes_total__transfer_type_GPU_to_CPU`.

    Labels in `SUMMED_LABELS` are left out (their series are summed), the rest are kept in
    sorted order, so the same series always gets the same key.
    """
    kept = sorted((k, v) for k, v in labels.items() if k not in SUMMED_LABELS)
    return _clean(name) + "".join(f"__{_clean(k)}_{_clean(v)}" for k, v in kept)


def _pass_through(by_name: dict[str, list[tuple[dict[str, str], float]]],
                  out: dict[str, float]) -> None:
    """Add every `vllm:kv_offload_*` / `lmcache:*` series; histogram buckets and `_created`
    timestamps are dropped (sums and counts are enough, and they would swamp the sample)."""
    for name, rows in by_name.items():
        if not name.startswith(PASS_THROUGH_PREFIXES):
            continue
        if name.endswith(("_bucket", "_created", "_gsum", "_gcount")):
            continue
        parts: dict[str, list[float]] = {}
        for labels, value in rows:
            parts.setdefault(flat_key(name, labels), []).append(value)
        mean = name.endswith(FRACTION_SUFFIXES)
        out.update({k: _combine(v, mean) for k, v in parts.items()})


def parse_metrics(text: str) -> dict[str, float]:
    """One `/metrics` scrape as sample keys -> values (see `VLLM_SERIES`, `flat_key`).

    Raises ValueError when the text is not Prometheus exposition or holds no vLLM/LMCache
    series at all (an HTML error page or the wrong port would otherwise pass as "no data").
    """
    by_name = _samples_by_name(_families(text))
    if not any(name.startswith(("vllm:", "lmcache:", "lmcache_mp_")) for name in by_name):
        raise ValueError("no vllm:*, lmcache:* or lmcache_mp_* series in the /metrics text "
                         f"({len(by_name)} other series); is this a vLLM or LMCache server?")
    out: dict[str, float] = {}
    for series in ALL_SERIES:
        _select(series, by_name, out)
    _pass_through(by_name, out)
    return out


def is_cumulative(key: str) -> bool:
    """Whether a sample key is a counter (or histogram sum/count) that only grows."""
    if is_process_key(key):
        return True
    if key.startswith(tuple(_clean(p) for p in PASS_THROUGH_PREFIXES)):
        return key.split("__", 1)[0].endswith(("_total", "_sum", "_count"))
    for series in ALL_SERIES:
        if key == series.key or (series.split_label and key.startswith(series.key + "_")):
            return series.cumulative
    return False


async def scrape_once(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """GET and parse one scrape; failures come back as `{"scrape_error": text}`.

    Each GET has its own timeout (`SCRAPE_TIMEOUT_S`), whatever the session's, so a hung
    server delays the sampler (and its stop) by at most that long.
    """
    timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
    try:
        async with session.get(url, timeout=timeout) as response:
            body = await response.text()
            if response.status != 200:
                return {"scrape_error": f"HTTP {response.status}: {body.strip()[:200]}"}
        return parse_metrics(body)
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        text = str(err) or f"no answer within {SCRAPE_TIMEOUT_S} s"
        return {"scrape_error": f"{type(err).__name__}: {text}"[:500]}


async def _wait_or_stop(clock: SamplerClock, until_s: float, stop_event: asyncio.Event) -> None:
    """Sleep on the run clock until `until_s`, but wake as soon as `stop_event` is set."""
    if until_s <= clock.now_s():
        await asyncio.sleep(0)  # let other tasks (and a stop) run between back-to-back scrapes
        return
    sleeper = asyncio.ensure_future(clock.sleep_until(until_s))
    stopper = asyncio.ensure_future(stop_event.wait())
    try:
        await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sleeper, stopper):
            task.cancel()
        await asyncio.gather(sleeper, stopper, return_exceptions=True)


def _next_slot(slot: int, elapsed_s: float, interval_s: float) -> int:
    """Index of the next scrape slot: the following one, or, after an overrun, the first
    one still ahead (counting slots, not re-deriving them from the clock, keeps float
    rounding from firing a slot twice)."""
    slot += 1
    if slot * interval_s < elapsed_s:
        slot = math.floor(elapsed_s / interval_s) + 1
    return slot


async def sample_metrics(base_url: str, writer: SampleWriter, clock: SamplerClock,
                         interval_s: float, stop_event: asyncio.Event,
                         session: aiohttp.ClientSession | None = None,
                         extra_urls: Sequence[str] = (),
                         extra_values: Callable[[], dict[str, float]] | None = None) -> int:
    """Scrape `{base_url}/metrics` (and `{url}/metrics` of each of `extra_urls`, e.g. the
    LMCache server's) every `interval_s` until `stop_event` is set; one sample per scrape
    holds all of them (an extra URL's failure is `scrape_error_<i>`, not the sample's), and
    what `extra_values()` returns then (the run processes' CPU accounting).

    Each scrape is written as `{"time_s": <clock time when the scrape was sent>,
    "scrape_duration_s": ..., **parse_metrics(...)}`, or with `scrape_error` instead of the
    values when it failed; the loop goes on either way. Scrapes are due at start + k *
    interval_s on the run clock (no drift from slow scrapes); a scrape that overran its slot
    is followed at once by the next. Returns the number of samples written.
    """
    if interval_s <= 0:
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    url = base_url.rstrip("/") + "/metrics"
    extras = [u.rstrip("/") + "/metrics" for u in extra_urls]
    own_session = session is None
    if session is None:
        session = aiohttp.ClientSession()
    written = 0
    try:
        start_s, slot = clock.now_s(), 0
        while not stop_event.is_set():
            sent_s = clock.now_s()
            values = await scrape_once(session, url)
            for i, extra in enumerate(extras):
                more = await scrape_once(session, extra)
                if "scrape_error" in more:
                    more = {f"scrape_error_{i + 1}": more["scrape_error"]}
                values.update(more)
            if extra_values is not None:
                values.update(extra_values())
            writer.write_sample({"time_s": sent_s, "scrape_duration_s": clock.now_s() - sent_s,
                                 **values})
            written += 1
            slot = _next_slot(slot, clock.now_s() - start_s, interval_s)
            await _wait_or_stop(clock, start_s + slot * interval_s, stop_event)
    finally:
        if own_session:
            await session.close()
    return written


def _interval_increase(values: pd.Series) -> pd.Series:
    """Per-interval increase of a cumulative counter; a drop means the server restarted
    (counters reset to 0), so the new value itself is the increase (Prometheus' rule)."""
    step = values.diff()
    return step.where(step >= 0, values)


def _filled_counter(values: pd.Series) -> pd.Series:
    """A counter's values in time order with its gaps filled: the last value seen carries
    forward (a scrape that lacks a series already seen says nothing about it; reading it as 0
    made the next sample look like a reset and counted the whole total again), and only the
    leading gap is 0 (a labelled series appears when first incremented)."""
    return values.astype("float64").ffill().fillna(0.0)


def _rates_one(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    frame = frame.sort_values("time_s", kind="stable")
    out = pd.DataFrame({"time_s": frame["time_s"], "interval_s": frame["time_s"].diff()})
    for col in columns:
        out[col] = _interval_increase(_filled_counter(frame[col]))
        out[f"{col}_per_s"] = out[col] / out["interval_s"]
    for col in columns:
        if col.endswith("_hits_tokens") and col.replace("_hits_", "_queries_") in columns:
            queries = out[col.replace("_hits_", "_queries_")]
            share = out[col] / queries.where(queries > 0)
            out[col.removesuffix("_hits_tokens") + "_hit_share"] = share
    return out.iloc[1:]


def counter_rates(samples: pd.DataFrame, columns: Sequence[str] | None = None,
                  by: str | Sequence[str] | None = None) -> pd.DataFrame:
    """Per-interval increases (and per-second rates) of cumulative counters.

    One row per interval between consecutive good samples (ending at `time_s`, lasting
    `interval_s`); for each counter `c`, `c` is the increase over the interval and `c_per_s`
    the rate; for each `X_hits_tokens` / `X_queries_tokens` pair, `X_hit_share` is
    hits / queries over the interval (NaN when nothing was queried). Failed scrapes (rows
    with a `scrape_error`) are skipped, so an interval spans the gap. A counter missing from a
    good sample keeps the last value seen in its group (an increase of 0 there, then the
    whole change since at the next sample that has it), not 0, which would read as a reset and
    count the total again; before its first value it counts as 0 (labelled series appear only
    when first incremented). A drop is a server restart: the new value is the increase. A
    series that vanished at a restart and came back above its old value is undercounted (the
    samples cannot tell that case apart). `columns` defaults to every cumulative key present;
    `by` (e.g. "tier") differences each group separately.
    """
    if columns is None:
        columns = [c for c in samples.columns if is_cumulative(str(c))]
    require_columns(samples, ["time_s", *columns], "counter_rates")
    good = samples
    if "scrape_error" in samples:
        error = samples["scrape_error"]
        good = samples[error.isna() | (error.astype(str) == "")]
    if by is None:
        return _rates_one(good, list(columns)).reset_index(drop=True)
    keys = [by] if isinstance(by, str) else list(by)
    parts = [_rates_one(group, list(columns)).assign(**dict(zip(keys, name, strict=True)))
             for name, group in good.groupby(keys, sort=False)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
