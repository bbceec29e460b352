"""Validate the digital twin against a live run: same workload, same tier, the same metrics.

For each live run folder the workload is regenerated from its `meta.json` (the digest must
match, else the comparison would be of two different loads), simulated on the server spec's
twin with the run's own tier as it was deployed (`profile_for_run`: the engine's KV budget and
scheduler limits from the run's tier config, the offload stores of the spec's tier of that
name with LMCache's L1 size and disk limit from the config), and both runs are reduced to the
same numbers (`METRICS`).

One window for every metric (`Window`): the requests sent after the warm-up
(`options.warmup_s`, the records' `is_warmup`) and before the end of the sending window
(`run_seconds`), the steady state as study A reads it. Per-request numbers come from those
requests; the servers' cumulative counters are differenced between the samples nearest the
window's two ends (`counter_increase`), the same rule for the live engine and the twin:

* `ttft_median_s`, `ttft_p90_s`: TTFT of the window's successful requests;
* `total_tok_s`, `output_tok_s`: their prompt (cached included) + output tokens, and output
  tokens, per second of the window;
* `cached_share`: their cached prompt tokens / prompt tokens (`analysis.prompt_split`);
* `l1_hit_share`, `l2_hit_share`: prompt tokens loaded from the offload tier's first store
  (LMCache's L1) and from its second (the disk, L2), over all prompt tokens: live from the
  servers' counters over the window (`analysis.prompt_tokens_by_source` on the samples
  between the window's ends), in the twin from the window's records' per-store loaded tokens;
* `l1_fill_s`: the first eviction from L1 (`analysis.fill_time_s`: LMCache's eviction counter
  live, the store's stats in the twin), an event time over the whole run, not a window sum;
  NaN where it never evicted;
* `resume_ttft_median_s`: median TTFT of the window's resumes (first turn after a long idle,
  `analysis.resume_stats`);
* `preemptions`: increase of the cumulative `preemptions` counter (vLLM's, the twin
  scheduler's `Counters.preemptions` in its samples) over the window;
* `queue_time_mean_s`: mean time before scheduling: live vLLM's queue-time histogram
  (`queue_time_sum_s` / `queue_time_count`, both differenced over the window); in the twin
  the mean `engine_queue_s` + `load_s` of the window's requests (as `queue_split` compares
  them): like vLLM's, from when the engine core takes the request in, between steps.

The live client measures TTFT from its own send, so it includes the API server's
per-request latency (HTTP, JSON, input processing, streaming), which the simulated engine
core does not model; the profile's `server.front_end_latency_s` (fitted by
`kvrepro.calibration.fit`) puts it on the simulated first-token and finish times, and so into the
closed loop of each simulated session.

`error` (`metric_error`): shares (`SHARE_METRICS`) in percentage points, 100 x (sim - live)
(`error_unit` "pp"); times, rates and counts in percent, 100 x (sim - live) / live ("%");
NaN where either value is missing, or for a percentage where live is 0 (a run whose L1 never
filled has no fill time; a run without preemptions gives no relative error).

Evidence needs a yardstick: `null_sim` is the same run on a null twin (`null_profile`:
compute, memory and offload reads 100x faster, no overheads, no front end, no lookup or
connector cost). Where even that twin lands within `NULL_MARGIN` of the live value
(throughput = offered load in a closed loop that keeps up, a baseline's zero offload hits),
agreement says nothing about the fitted model: the row is shown but `informative` is False
and `summary` does not count it.

The fit itself is guarded separately (`fit_guard_table`, tests/calibration/test_fidelity_guard.py):
the twin must reproduce the lone requests of the fit run (`FIT_RUN`) that its
`FITTED_PARAMETERS` were fitted to.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvrepro._checks import load_yaml
from kvrepro._paths import data_file
from kvrepro.analysis.runs import (
    decode_step_s,
    fill_time_s,
    outside_cpu,
    process_cpu,
    prompt_split,
    prompt_tokens_by_source,
    resume_stats,
    token_delivery,
)
from kvrepro.calibration.fit import MIN_DECODE_STEPS, decode_context_tokens, isolated, line_fit
from kvrepro.engines.live.placement import autogroups
from kvrepro.engines.live.tiers import TierConfig, read_tier_config
from kvrepro.engines.sim.config import OffloadTier, SimProfile, SimTier
from kvrepro.engines.sim.engine import SimResult, simulate
from kvrepro.records import Run, read_run
from kvrepro.stores import KINDS
from kvrepro.workload import build_workload
from kvrepro.workload.base import Workload

METRICS = ("ttft_median_s", "ttft_p90_s", "total_tok_s", "output_tok_s", "cached_share",
           "l1_hit_share", "l2_hit_share", "l1_fill_s", "resume_ttft_median_s",
           "preemptions", "queue_time_mean_s")
REDEFINED_METRICS = {
    "queue_time_mean_s": (datetime.fromisoformat("2026-12-06T01:30:00+00:00"),
                          "the twin's queue time starts, like vLLM's, when the engine core takes "
                          "the request in after the step in flight (`Request.queued_s`); "
                          "before, from the send"),
}
"""Metrics whose twin side changed meaning after predictions were committed: since when, and
how. Committed numbers are scored as they are; `redefined_since` tells which metrics of an
older commit the twin of today no longer computes the same way (its drift leaves them out)."""


def redefined_since(committed: datetime | None) -> list[str]:
    """The metrics redefined after predictions committed at `committed` (all, if never)."""
    return [m for m, (since, _) in REDEFINED_METRICS.items()
            if committed is None or committed < since]


SHARE_METRICS = ("cached_share", "l1_hit_share", "l2_hit_share")
"""Fractions of the prompt tokens: scored in percentage points, not relative to live."""
TABLE_COLUMNS = ("run", "tier", "metric", "live", "sim", "null_sim", "error", "error_unit",
                 "null_error", "informative")
NULL_MARGIN = 10.0
"""A metric the null twin gets within this many % (pp for shares) is not evidence."""
NULL_SPEEDUP = 100.0
"""How much faster the null twin computes, reads memory and loads from offload stores."""
OFFLOAD_METRICS = ("l1_hit_share", "l2_hit_share", "l1_fill_s")
LIVE_L1_BYTES = "lmcache_l1_bytes_used"
LIVE_L1_EVICTED = "lmcache_l1_evicted_chunks"
"""Live samples' L1 columns: bytes held, and LMCache's eviction counter (absent until the
first eviction)."""


@dataclass(frozen=True)
class Window:
    """The steady-state window every metric reads: requests sent in [start_s, end_s]
    (after the warm-up, before the end of sending), counters between the samples nearest
    its ends."""

    start_s: float
    end_s: float

    @property
    def length_s(self) -> float:
        """Seconds of the window (the denominator of the rates)."""
        return self.end_s - self.start_s


@dataclass
class RunComparison:
    """One live run next to its simulation (and the null twin's): the table rows and the
    live and twin record sets."""

    table: pd.DataFrame
    live_records: pd.DataFrame
    sim_records: pd.DataFrame
    sim_stats: dict
    sim_wall_s: float


def window_requests(records: pd.DataFrame, window: Window) -> pd.DataFrame:
    """Successful requests sent in the window (warm-up requests excluded by their flag)."""
    ok = (records["error"].fillna("") == "") & records["first_token_s"].notna()
    sent = (records["send_s"] >= window.start_s) & (records["send_s"] <= window.end_s)
    return records[ok & sent & ~records["is_warmup"].astype(bool)]


def _good_samples(samples: pd.DataFrame) -> pd.DataFrame:
    """Samples without a scrape error, in time order."""
    good = samples
    if "scrape_error" in samples:
        good = samples[samples["scrape_error"].isna() | (samples["scrape_error"] == "")]
    return good.sort_values("time_s")


def window_samples(samples: pd.DataFrame, window: Window) -> pd.DataFrame:
    """The good samples from the one nearest the window's start to the one nearest its end
    (what a counter is differenced over)."""
    good = _good_samples(samples)
    if good.empty:
        return good
    times = good["time_s"].to_numpy(float)
    first = int(np.argmin(np.abs(times - window.start_s)))
    last = int(np.argmin(np.abs(times - window.end_s)))
    return good.iloc[first:last + 1]


def counter_increase(samples: pd.DataFrame, column: str, window: Window) -> float:
    """How much a cumulative counter grew over the window (NaN without the column or with
    fewer than two samples in it)."""
    part = window_samples(samples, window) if column in samples else samples.iloc[:0]
    values = part[column].astype("float64").dropna() if column in part else part
    return float(values.iloc[-1] - values.iloc[0]) if len(values) > 1 else math.nan


def _core_metrics(records: pd.DataFrame, window: Window) -> dict[str, float]:
    """TTFT, throughput, cached share and resume TTFT of one tier's window requests."""
    if records["tier"].nunique() != 1:
        raise ValueError(f"run_metrics: expected one tier, got {sorted(records.tier.unique())}")
    part = window_requests(records, window)
    ttft = part["ttft_s"].to_numpy(float)
    median, p90 = (np.quantile(ttft, [0.5, 0.9]) if len(ttft) else (math.nan, math.nan))
    output = float(part["output_tokens"].sum())
    resume = resume_stats(part, exclude_warmup=False)
    share = prompt_split(part)["hit_share"]
    return {"ttft_median_s": float(median), "ttft_p90_s": float(p90),
            "total_tok_s": (float(part["prompt_tokens"].sum()) + output) / window.length_s,
            "output_tok_s": output / window.length_s,
            "cached_share": float(share.iloc[0]) if len(share) else math.nan,
            "resume_ttft_median_s": (float(resume["resume_ttft_median_s"].iloc[0])
                                     if len(resume) else math.nan)}


def live_offload_metrics(samples: pd.DataFrame, window: Window) -> dict[str, float]:
    """L1 / L2 hit shares over the window and L1 fill time of a live run, from its
    servers' counters (`samples` with a `tier` column)."""
    if samples.empty or "prompt_tokens_local_compute" not in samples:
        return {m: math.nan for m in OFFLOAD_METRICS}
    src = prompt_tokens_by_source(window_samples(samples, window)).iloc[0]
    total = src["computed_tokens"] + src["engine_hit_tokens"] + src["offload_hit_tokens"]
    offload = src["offload_hit_tokens"]
    l1 = src["offload_l1_tokens"] if offload else 0.0
    l2 = src["offload_l2_tokens"] if offload else 0.0
    # LMCache exports its eviction counter from the first eviction on: none, no fill
    fill = (fill_time_s(samples, LIVE_L1_BYTES) if LIVE_L1_EVICTED in samples
            else math.nan)
    return {"l1_hit_share": float(l1 / total), "l2_hit_share": float(l2 / total),
            "l1_fill_s": fill}


def sim_offload_metrics(result: SimResult, tier: SimTier, window: Window) -> dict[str, float]:
    """L1 / L2 hit shares (the window records' loaded tokens per store) and L1 fill time
    (the run's stats)."""
    records, names = window_requests(result.records, window), [s.name for s in tier.stores]
    total = float(records["prompt_tokens"].sum())

    def share(i: int) -> float:
        column = f"loaded_tokens_{names[i]}" if i < len(names) else ""
        return float(records[column].sum() / total) if column in records and total else 0.0

    fill = math.nan
    if names:
        fill = fill_time_s(result.samples, f"{names[0]}_bytes_used", stats=result.stats)
    return {"l1_hit_share": share(0), "l2_hit_share": share(1), "l1_fill_s": fill}


def live_counter_metrics(samples: pd.DataFrame, window: Window) -> dict[str, float]:
    """Preemptions and mean queue time over the window from vLLM's counters."""
    count = counter_increase(samples, "queue_time_count", window)
    total_s = counter_increase(samples, "queue_time_sum_s", window)
    return {"preemptions": counter_increase(samples, "preemptions", window),
            "queue_time_mean_s": total_s / count if count else math.nan}


def sim_counter_metrics(result: SimResult, window: Window) -> dict[str, float]:
    """Preemptions over the window (the scheduler's counter in the samples) and the mean
    time before scheduling of the window's requests (`engine_queue_s` + `load_s`)."""
    part = window_requests(result.records, window)
    wait_s = (part["engine_queue_s"] + part["load_s"]).mean() if len(part) else math.nan
    return {"preemptions": counter_increase(result.samples, "preemptions", window),
            "queue_time_mean_s": float(wait_s)}


def run_metrics(records: pd.DataFrame, window: Window,
                offload: Mapping[str, float] | None = None,
                counters: Mapping[str, float] | None = None) -> dict[str, float]:
    """The validation metrics of one run's records (one tier) over `window`, see the module
    doc; the offload metrics come from `live_offload_metrics` / `sim_offload_metrics`, the
    counter ones from `live_counter_metrics` / `sim_counter_metrics` (NaN if None)."""
    nan_offload = {m: math.nan for m in OFFLOAD_METRICS}
    nan_counters = {"preemptions": math.nan, "queue_time_mean_s": math.nan}
    out = {**_core_metrics(records, window), **(offload or nan_offload),
           **(counters or nan_counters)}
    return {m: out[m] for m in METRICS}


def relative_error_pct(live: float, sim: float) -> float:
    """100 x (sim - live) / live; NaN when live is 0 or either value is missing."""
    if not np.isfinite(live) or not np.isfinite(sim) or live == 0:
        return float("nan")
    return 100.0 * (sim - live) / live


def error_unit(metric: str) -> str:
    """"pp" for a share of the prompt tokens (`SHARE_METRICS`, any `*_share`), else "%"."""
    return "pp" if metric in SHARE_METRICS or metric.endswith("_share") else "%"


def metric_error(metric: str, live: float, sim: float) -> float:
    """The twin's signed error on one metric in its `error_unit`: percentage points for a
    share (a relative error on a share near 0 explodes and says nothing), percent else."""
    if error_unit(metric) == "%":
        return relative_error_pct(live, sim)
    if not np.isfinite(live) or not np.isfinite(sim):
        return float("nan")
    return 100.0 * (sim - live)


def is_informative(error: float, null_error: float) -> bool:
    """A row counts as evidence when it is judged and the null twin misses it by more than
    `NULL_MARGIN` (or has no value where the twin has one)."""
    if not np.isfinite(error):
        return False
    return not np.isfinite(null_error) or abs(null_error) > NULL_MARGIN


def compare_metrics(live: Mapping[str, float], sim: Mapping[str, float],
                    null_sim: Mapping[str, float], run: str, tier: str) -> pd.DataFrame:
    """Tidy rows (`TABLE_COLUMNS`) for every metric in METRICS."""
    rows = []
    for m in METRICS:
        error, null_error = metric_error(m, live[m], sim[m]), metric_error(m, live[m],
                                                                          null_sim[m])
        rows.append({"run": run, "tier": tier, "metric": m, "live": live[m], "sim": sim[m],
                     "null_sim": null_sim[m], "error": error, "error_unit": error_unit(m),
                     "null_error": null_error,
                     "informative": is_informative(error, null_error)})
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


def workload_of(run: Run) -> Workload:
    """Regenerate a live run's workload from its meta and check it is the one that ran."""
    spec = run.meta["workload"]
    workload = build_workload(spec["kind"], spec["params"])
    if workload.digest() != run.meta.get("workload_digest"):
        raise ValueError(f"{run.path}: regenerated workload digest {workload.digest()[:12]} "
                         f"differs from the run's {str(run.meta.get('workload_digest'))[:12]} "
                         f"(generator changed since the run?)")
    return workload


def _deployed_capacity_bytes(store: OffloadTier, mp: Mapping[str, Any], position: int
                             ) -> float | None:
    """The capacity the run deployed the store at `position` with, read back from its
    recorded multi-process settings by its kind (`StoreBase.deployed_capacity_bytes`, the
    inverse of the kind's rendering); None: not recorded there, or a store without a kind."""
    if store.kind is None:
        return None
    return KINDS[store.kind].deployed_capacity_bytes(dict(mp), position)


def _deployed_tier(profile: SimProfile, config: TierConfig, tier: str) -> SimTier:
    """The spec's tier `tier` with LMCache's sizes as the run deployed them (each store's
    capacity read back from the rendered `lmcache_mp` settings by its kind); a tier the spec
    lacks is a baseline."""
    if tier not in profile.tiers:
        return SimTier(name=tier)
    sim_tier = profile.tiers[tier].model_copy(deep=True, update={"kv_cache_bytes": None})
    if config.lmcache_mp is None:
        return sim_tier
    mp = config.lmcache_mp.model_dump()
    for position, store in enumerate(sim_tier.stores):
        capacity = _deployed_capacity_bytes(store, mp, position)
        if capacity is not None:
            store.capacity_bytes = capacity
    return sim_tier


def check_placement(profile: SimProfile, meta: Mapping) -> None:
    """ValueError when a live run was recorded on other CPUs than the profile's placement:
    the twin's rates hold for the placement they were fitted on (`SimProfile.placement`).
    A run that recorded no placement (older runs) is not checked."""
    recorded = (meta.get("placement") or {}).get("spec")
    if recorded is None:
        return
    wanted = profile.placement.model_dump()
    if recorded != wanted:
        differ = {k: (recorded.get(k), v) for k, v in wanted.items() if recorded.get(k) != v}
        raise ValueError(f"tier {meta.get('tier')!r} ran with another CPU placement than the "
                         f"profile's (run, profile): {differ}")


def profile_for_run(profile: SimProfile, meta: Mapping) -> SimProfile:
    """A copy of `profile` serving the live run's tier as deployed: its KV budget (the whole
    tensor-parallel group's, `TierConfig.kv_cache_bytes`; an old record's per-GPU
    `kv_cache_memory_bytes` x its TP size) and scheduler limits (exact, from
    `meta["tier_config"]`, `read_tier_config`) and the spec's tier of that name
    with the run's LMCache sizes (`_deployed_tier`); a name the spec lacks gets no offload.
    The run must have been recorded on the profile's placement (`check_placement`)."""
    check_placement(profile, meta)
    config, tier = read_tier_config(meta["tier_config"]), meta["tier"]
    updates = {"kv_cache_bytes": float(config.kv_cache_bytes),
               "max_num_batched_tokens": int(config.max_num_batched_tokens),
               "max_model_len": int(config.max_model_len)}
    if config.max_num_seqs:
        updates["max_num_seqs"] = int(config.max_num_seqs)
    server = profile.server.model_copy(update=updates)
    deployed = _deployed_tier(profile, config, tier)
    return SimProfile.model_validate({**profile.model_dump(), "server": server.model_dump(),
                                      "tiers": {tier: deployed.model_dump()}})


def run_seconds(run: Run) -> float:
    """The run's sending window: the client's duration, else the workload's."""
    options = run.meta.get("options", {})
    return float(options.get("duration_s") or run.meta["workload"]["params"]["duration_s"])


def simulate_run(run: Run, profile: SimProfile) -> tuple[SimResult, SimProfile, float]:
    """The twin on a live run's workload and deployed tier: (result, profile used, wall s)."""
    deployed = profile_for_run(profile, run.meta)
    options = run.meta.get("options", {})
    started = time.perf_counter()
    result = simulate(workload_of(run), deployed, run.meta["tier"], duration_s=run_seconds(run),
                      warmup_s=float(options.get("warmup_s", 0.0)), progress=False)
    return result, deployed, time.perf_counter() - started


def run_window(run: Run) -> Window:
    """The run's steady-state window: from the client's warm-up to its sending end."""
    return Window(float(run.meta.get("options", {}).get("warmup_s", 0.0)), run_seconds(run))


def null_profile(profile: SimProfile) -> SimProfile:
    """The null twin of `profile`: compute, memory bandwidth and every store's read rate
    `NULL_SPEEDUP` x faster, no step overhead, front end, lookup or connector cost. What it
    gets right comes from the workload and the closed loop, not from anything fitted."""
    fast = NULL_SPEEDUP
    server = profile.server.model_copy(update={
        "fp16_tflops": profile.server.fp16_tflops * fast,
        "attention_tflops": (None if profile.server.attention_tflops is None
                             else profile.server.attention_tflops * fast),
        "mem_bw_tb_s": profile.server.mem_bw_tb_s * fast,
        "step_overhead_s": 0.0, "front_end_latency_s": 0.0})
    tiers = {}
    for name, tier in profile.tiers.items():
        stores = [s.model_copy(update={"read_bw_bytes_s": s.read_bw_bytes_s * fast})
                  for s in tier.stores]
        tiers[name] = tier.model_copy(update={
            "stores": stores, "twin_lookup_s": 0.0, "twin_connector_step_s": 0.0,
            "twin_connector_request_s": 0.0, "twin_connector_token_s": 0.0})
    return profile.model_copy(update={"server": server, "tiers": tiers})


def _sim_metrics(run: Run, profile: SimProfile, window: Window
                 ) -> tuple[dict[str, float], SimResult, SimTier, float]:
    """The twin's metrics of a live run on `profile`: (metrics, result, tier, wall s)."""
    result, deployed, wall_s = simulate_run(run, profile)
    tier = deployed.tier(run.meta["tier"])
    metrics = run_metrics(result.records, window, sim_offload_metrics(result, tier, window),
                          sim_counter_metrics(result, window))
    return metrics, result, tier, wall_s


def planned_run(meta: Mapping[str, Any]) -> Run:
    """A run not recorded yet, as the twin needs it: the meta.json the live engine will
    write (`kvrepro.calibration.preregister.planned_meta`), no records, no samples."""
    return Run(Path("<planned>"), pd.DataFrame(), pd.DataFrame(), dict(meta), [])


def predicted_metrics(meta: Mapping[str, Any], profile: SimProfile) -> dict[str, float]:
    """The twin's METRICS for a planned run (`planned_run`), over the window it will be
    scored on: what a pre-registered prediction commits (skip_l1 tiers' L1 metrics NaN,
    as `compare_run` scores them)."""
    run = planned_run(meta)
    metrics, _, tier, _ = _sim_metrics(run, profile, run_window(run))
    _blank_pass_through_l1(tier, metrics)
    return metrics


def live_run_metrics(run: Run, window: Window | None = None) -> dict[str, float]:
    """A live run's validation metrics over `window` (default: its own, `run_window`)."""
    window = window or run_window(run)
    samples = run.samples.assign(tier=run.meta["tier"])
    return run_metrics(run.records, window,
                       live_offload_metrics(samples, window) if not samples.empty else None,
                       live_counter_metrics(samples, window) if not samples.empty else None)


def _blank_pass_through_l1(tier: SimTier, *metrics: dict[str, float]) -> None:
    """Blank the L1 rows of `metrics` where the tier's L1 only passes the disk's chunks
    through (skip_l1): LMCache counts no L1 hits there, and its evictions are churn, not a
    fill."""
    if tier.skip_l1:
        for each in metrics:
            each.update({"l1_hit_share": math.nan, "l1_fill_s": math.nan})


def compare_run(run_dir: str | Path, profile: SimProfile,
                run_name: str | None = None) -> RunComparison:
    """Simulate one live run's workload on its tier, on the twin and on its null twin, and
    compare every metric over the run's window."""
    run = read_run(run_dir)
    window = run_window(run)
    sim, result, tier, wall_s = _sim_metrics(run, profile, window)
    null = _sim_metrics(run, null_profile(profile), window)[0]
    live = live_run_metrics(run)
    _blank_pass_through_l1(tier, live, sim, null)
    name = run_name or Path(run_dir).resolve().parent.name
    table = compare_metrics(live, sim, null, name, run.meta["tier"])
    return RunComparison(table, run.records, result.records, result.stats, wall_s)


def validation_table(runs: Mapping[str, list[str | Path]], profile: SimProfile,
                     own: Mapping[str, SimProfile] | None = None
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Compare every tier folder of every named run: (table, live + sim records).

    `runs` maps a run name (e.g. "fit", "held-out") to its tier folders; a run named in
    `own` is simulated on its own profile instead of `profile` (a draw predicted from a
    same-day spec: `preregister.draw_profiles`). The records frame has both engines'
    records with a `run` column, for CDFs or other figures.
    """
    tables, records = [], []
    for name, tier_dirs in runs.items():
        for tier_dir in tier_dirs:
            cmp = compare_run(tier_dir, (own or {}).get(name, profile), run_name=name)
            tables.append(cmp.table)
            records += [cmp.live_records.assign(run=name), cmp.sim_records.assign(run=name)]
    return (pd.concat(tables, ignore_index=True),
            pd.concat(records, ignore_index=True, sort=False))


FIT_RUN = "cpu_tiny_fit"
"""The live campaign the tiny server's twin is fitted on (data/live/<FIT_RUN>), recorded
with the spec's CPU placement."""
ONE_SESSION_FIT = "cpu_tiny_fit_one_session"
"""The fit campaign's command recorded with the live servers in the load client's session
(data/live/<ONE_SESSION_FIT>, 2026-12-05 18:01 UTC): the fifth draw's `fitted_on`, and the
recording `client_table` sets against the earlier ones."""
HELD_OUT_ROOT = "cpu_tiny_prereg"
"""data/live/<HELD_OUT_ROOT>: the pre-registered held-out campaigns, one folder per set, and
their plan.yaml (`kvrepro.calibration.preregister`, whose `PREREG_ROOT` is this name)."""


REDRAWN_ROOT = "cpu_tiny_prereg_host"
"""data/live/<REDRAWN_ROOT>: the same five sets drawn again with new seeds (issue [host-cpu]),
pre-registered on the twin with its host-CPU model, because the runs of `HELD_OUT_ROOT` were
used to choose between variants of that model and no longer score it. Their runs are named
`redrawn(set)` in a validation table."""
REDRAWN_SUFFIX = "-redrawn"
THIRD_ROOT = "cpu_tiny_prereg_third"
"""data/live/<THIRD_ROOT>: the five sets drawn a third time (seeds +200), pre-registered on
the twin with the LMCache connector's measured lookup and per-token cost, because both earlier
draws were used to find that change. Their runs are named `redrawn(set, THIRD_SUFFIX)`."""
THIRD_SUFFIX = "-third"
FOURTH_ROOT = "cpu_tiny_prereg_fourth"
"""data/live/<FOURTH_ROOT>: the five sets drawn a fourth time (seeds +300), pre-registered on
the frozen twin with a spec the fit routine wrote on the fit campaign recorded again that day
(its plan's `fitted_on`), because the third draw's miss was mostly the machine's drift since
the fit day. Their runs are named `redrawn(set, FOURTH_SUFFIX)`."""
FOURTH_SUFFIX = "-fourth"
FIFTH_ROOT = "cpu_tiny_prereg_fifth"
"""data/live/<FIFTH_ROOT>: the five sets drawn a fifth time (seeds +400), pre-registered like
the fourth (the frozen twin, a spec the fit routine wrote that day) but recorded, fit campaign
included, with the live servers in the load client's session: before, they ran in sessions of
their own, and the client on their CPU stalled 70-400 ms at a time
(`engines.live.processes.ManagedProcess`). Their runs are named `redrawn(set, FIFTH_SUFFIX)`."""
FIFTH_SUFFIX = "-fifth"
SIXTH_ROOT = "cpu_tiny_prereg_sixth"
"""data/live/<SIXTH_ROOT>: the five sets drawn a sixth time (seeds +500), pre-registered on
the twin with the two-rate prefill and the engine's work per new request, its spec written by
the fit routine with `--attention-rate` on the fifth draw's fit campaign, because the fifth
draw's misses (long prompts under load) chose that change. Their runs are named
`redrawn(set, SIXTH_SUFFIX)`."""
SIXTH_SUFFIX = "-sixth"
SEVENTH_ROOT = "cpu_tiny_prereg_seventh"
"""data/live/<SEVENTH_ROOT>: the five sets drawn a seventh time (seeds +600), pre-registered on
the sixth draw's twin, unchanged, its spec written by the fit routine with `--attention-rate`
on a fit campaign recorded minutes before (data/live/cpu_tiny_fit_seventh), because the sixth
draw's runs met a machine slower than its fit three hours earlier (`machine_table`). Their
runs are named `redrawn(set, SEVENTH_SUFFIX)`."""
SEVENTH_SUFFIX = "-seventh"
EIGHTH_ROOT = "cpu_tiny_prereg_eighth"
"""data/live/<EIGHTH_ROOT>: the five sets drawn an eighth time (seeds +700), pre-registered on
the twin whose queue time counts as vLLM's (`REDEFINED_METRICS`) with the engine's intake
measured (`--engine-intake`), its spec written by the fit routine on a fit campaign recorded
minutes before (data/live/cpu_tiny_fit_eighth), as the seventh's. Their runs are named
`redrawn(set, EIGHTH_SUFFIX)`."""
EIGHTH_SUFFIX = "-eighth"
DRAWS = ((HELD_OUT_ROOT, ""), (REDRAWN_ROOT, REDRAWN_SUFFIX), (THIRD_ROOT, THIRD_SUFFIX),
         (FOURTH_ROOT, FOURTH_SUFFIX), (FIFTH_ROOT, FIFTH_SUFFIX), (SIXTH_ROOT, SIXTH_SUFFIX),
         (SEVENTH_ROOT, SEVENTH_SUFFIX), (EIGHTH_ROOT, EIGHTH_SUFFIX))
"""Every draw of the held-out sets, in order: its folder under data/live and the suffix its
runs' names carry in a validation table (`redrawn`)."""


def redrawn(name: str, suffix: str = REDRAWN_SUFFIX) -> str:
    """The validation table's run name of held-out set `name` in the draw of `suffix`
    (`DRAWS`; by default the second)."""
    return f"{name}{suffix}"


def set_of(run: str) -> str:
    """The held-out set a run name stands for (a later draw's name without its suffix)."""
    for _, suffix in DRAWS[1:]:
        if run.endswith(suffix):
            return run.removesuffix(suffix)
    return run


@functools.cache
def held_out_sets() -> tuple[str, ...]:
    """The pre-registered held-out sets, in the order of the package's plan.yaml (its `sets`,
    the one list of them; `preregister.load_plan` checks the whole plan): the twin's
    predictions were committed before each was recorded, and none is used for fitting.
    Shipped: another seed and session rate; a saturating load; another L1 size and context
    cap; decode-heavy turns; more returning users with shorter idles. Also readable as the
    module attribute `HELD_OUT_SETS`."""
    path = data_file("live", HELD_OUT_ROOT, "plan.yaml")
    plan = load_yaml(path.read_text(), str(path))
    if not isinstance(plan, dict) or not isinstance(plan.get("sets"), dict):
        raise ValueError(f"{path}: no 'sets' mapping")
    return tuple(plan["sets"])


def __getattr__(name: str) -> Any:
    """`HELD_OUT_SETS`: `held_out_sets()`, read from the plan when first asked for."""
    if name == "HELD_OUT_SETS":
        return held_out_sets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
LIVE_TIERS = ("small-kv", "dram", "flash")


def shipped_runs(live_dir: str | Path | None = None,
                 tiers: tuple[str, ...] = LIVE_TIERS) -> dict[str, list[Path]]:
    """The fit run and the recorded held-out runs, tier folders by run name
    (`validation_table`'s input): the sets of each draw (`DRAWS`), named `redrawn(set,
    suffix)`; `live_dir` defaults to the package's data/live. A set not recorded yet (its
    predictions only) is left out."""
    root = Path(live_dir) if live_dir is not None else data_file("live")
    runs = {"fit": [root / FIT_RUN / t for t in tiers]}
    for folder, suffix in DRAWS:
        for name in held_out_sets():
            dirs = [root / folder / name / t for t in tiers]
            if all((d / "meta.json").exists() for d in dirs):
                runs[redrawn(name, suffix)] = dirs
    return runs


def lone_decoders(records: pd.DataFrame) -> pd.DataFrame:
    """The requests alone on the server from send to finish with more than 4 output tokens:
    their decode steps are the machine's and the step model's, nothing else's."""
    return records[isolated(records) & (records["output_tokens"] > 4)]


def lone_decode_step_ms(run: Run) -> float:
    """A run's median decode step of its `lone_decoders`, in ms: the machine's speed that
    hour, as the twin's step model sees it (NaN without lone requests)."""
    step_s = decode_step_s(lone_decoders(run.records))
    return 1e3 * float(step_s.median()) if len(step_s) else math.nan


def decode_residuals(run_dir: str | Path, profile: SimProfile) -> dict[str, Any]:
    """How far a live run's lone decode steps sit from the twin's step model: a check that
    the machine was quiet (other work on the 2 cores slows every step; no engine model can
    predict that). Lone requests with more than 4 output tokens; residual = live mean step
    time - (overhead + connector costs + weights and KV at the fitted rate)."""
    run = read_run(run_dir)
    deployed = profile_for_run(profile, run.meta)
    s, t = deployed.server, deployed.tier(run.meta["tier"])
    lone = lone_decoders(run.records)
    model = s.model_spec()
    ctx = lone["prompt_tokens"] + lone["output_tokens"] / 2
    step_s = (s.step_overhead_s + t.twin_connector_step_s + t.twin_connector_request_s
              + (model.active_weight_bytes + ctx * model.kv_bytes_per_token)
              / (s.mem_bw_tb_s * 1e12 * s.decode_efficiency))
    res_s = decode_step_s(lone) - step_s
    return {"tier": run.meta["tier"], "started_utc": run.meta.get("started_utc"),
            "n_lone": int(len(lone)), "twin_step_median_ms": float(1e3 * step_s.median()),
            "decode_residual_median_ms": float(1e3 * res_s.median()),
            "decode_residual_p90_ms": float(1e3 * res_s.quantile(0.9)),
            "share_over_1ms": float((res_s > 0.001).mean()) if len(res_s) else math.nan}


def machine_table(runs: Mapping[str, list[str | Path]], profile: SimProfile,
                  own: Mapping[str, SimProfile] | None = None,
                  tier: str = "small-kv") -> pd.DataFrame:
    """Per run (`validation_table`'s `runs` and `own`): when its `tier` started and how far
    that tier's lone decode steps sat from the twin that scored it (`decode_residuals`), in
    ms and in % of the twin's lone step. Why: a lone request's decode steps are the machine's
    and the step model's, nothing else's; a run whose lone steps are slower than the twin's
    met a slower machine than its fit did (the speed probe, a compute loop, does not see it),
    and every queue of the run amplifies that."""
    rows = []
    for name, tier_dirs in runs.items():
        for folder in (Path(d) for d in tier_dirs if Path(d).name == tier):
            res = decode_residuals(folder, (own or {}).get(name, profile))
            rows.append({"run": name, "started_utc": res["started_utc"], "n_lone": res["n_lone"],
                         "twin_step_ms": res["twin_step_median_ms"],
                         "residual_ms": res["decode_residual_median_ms"],
                         "residual_pct": 100.0 * res["decode_residual_median_ms"]
                         / res["twin_step_median_ms"]})
    return pd.DataFrame(rows)


def machine_adjusted(profile: SimProfile, residual_s: float) -> SimProfile:
    """`profile` with `residual_s` added to every engine step's host part (`step_overhead_s`,
    which the twin's host model may stretch; at 0 where the sum would be negative): the twin
    given a run's measured lone decode residual (`machine_table`). A diagnostic of how much of
    a miss the machine of that day explains, never a prediction: the residual is read off the
    run it then scores."""
    server = profile.server
    return profile.model_copy(update={"server": server.model_copy(
        update={"step_overhead_s": max(0.0, server.step_overhead_s + residual_s)})})


def machine_whatif_table(runs: Mapping[str, list[str | Path]], profile: SimProfile,
                         own: Mapping[str, SimProfile] | None = None) -> pd.DataFrame:
    """`validation_table` with each run's twin `machine_adjusted` by the residual of its
    baseline tier (`machine_table`; one per set: its three tiers ran minutes apart on the
    machine of that hour)."""
    machine = machine_table(runs, profile, own).set_index("run")["residual_ms"]
    adjusted = {name: machine_adjusted((own or {}).get(name, profile), machine[name] / 1e3)
                for name in runs if name in machine.index}
    return validation_table({n: runs[n] for n in adjusted}, profile, adjusted)[0]


DRIFT_ROOT = "cpu_tiny_drift"
"""data/live/<DRIFT_ROOT>: the fit run's baseline tier recorded again with the same command on
the day of the redrawn sets (its run.sh): a probe of the machine, not a held-out run."""


def drift_table(profile: SimProfile, live_dir: str | Path | None = None,
                tier: str = "small-kv") -> pd.DataFrame:
    """The fit run's `tier` against the same command recorded again (`DRIFT_ROOT`): the fit
    guard's metrics (lone requests, `fit_guard_metrics`) and the lone decode steps' median
    residual against the fitted step model, live on each day and in the twin, and the live
    change in %. Why: a held-out run recorded on another day meets the machine of that day;
    where the same workload runs faster or slower than at the fit, the twin's miss on that
    day's runs is the machine's, not the model's, and shows here first."""
    root = Path(live_dir) if live_dir is not None else data_file("live")
    rows = []
    for name, folder in (("fit", root / FIT_RUN / tier), ("probe", root / DRIFT_ROOT / tier)):
        run = read_run(folder)
        rows += [{**r, "run": name} for r in fit_guard_metrics(run, simulate_replay(run, profile))]
        residual = decode_residuals(folder, profile)
        rows.append({"run": name, "metric": "decode_residual_median_s", "live":
                     residual["decode_residual_median_ms"] / 1e3, "sim": 0.0,
                     "n": residual["n_lone"]})
    table = pd.DataFrame(rows).pivot(index="metric", columns="run", values=["live", "sim", "n"])
    table.columns = [f"{kind}_{run}" for kind, run in table.columns]
    change = (table["live_probe"] / table["live_fit"] - 1.0) * 100.0
    return table.assign(live_change_pct=change.where(~table.index.str.contains("residual")))


REPLICATES = (FIT_RUN, DRIFT_ROOT, "cpu_tiny_fit_repeat", "cpu_tiny_fit_repeat2",
              "cpu_tiny_fit_repeat3")
"""data/live/<name>: the fit campaign's command recorded at five times, oldest first: the fit
run (2026-12-02 06:55 UTC), the drift probe (its baseline tier, 2026-12-05 03:10) and three
replicates of all three tiers (2026-12-05 04:49, 05:12 and 14:59; their run.sh call the fit's,
the later two's runs carry the speed probe and the host's CPU counters; the last is the fourth
draw's `fitted_on`)."""


def replicate_conditions(live_dir: str | Path | None = None,
                         tiers: tuple[str, ...] = LIVE_TIERS) -> pd.DataFrame:
    """What each recording of `REPLICATES` met: its start, its lone requests' median decode
    step (ms), the speed probe before and after it (ms per CPU, meta.json) and the CPU that
    ran outside it (`analysis.runs.outside_cpu`); NaN where a run predates a measurement."""
    root = Path(live_dir) if live_dir is not None else data_file("live")
    rows = []
    for name in REPLICATES:
        for tier in tiers:
            if not (root / name / tier / "meta.json").exists():
                continue
            run = read_run(root / name / tier)
            probe = run.meta.get("speed_probe", {})
            rows.append({"run": name, "tier": tier, "started_utc": run.meta["started_utc"],
                         "lone_decode_step_ms": lone_decode_step_ms(run),
                         **{f"probe_{when}_{cpu}": 1e3 * seconds
                            for when, by_cpu in probe.items() for cpu, seconds in by_cpu.items()},
                         **outside_cpu(run.samples)})
    return pd.DataFrame(rows)


def replication_table(live_dir: str | Path | None = None,
                      tiers: tuple[str, ...] = LIVE_TIERS) -> pd.DataFrame:
    """The live stack against itself: for every two recordings of the fit command
    (`REPLICATES`) that hold a tier, each validation metric of the later one against the
    earlier one, in the twin's error units (`metric_error`), with the hours between their
    starts. Why: a twin that predicted the earlier run exactly would miss the later one by
    this much, so it is the floor under the twin's error on runs recorded at another time,
    and what an accuracy goal can be compared with."""
    root = Path(live_dir) if live_dir is not None else data_file("live")
    rows = []
    for tier in tiers:
        runs = [read_run(root / name / tier) for name in REPLICATES
                if (root / name / tier / "meta.json").exists()]
        metrics = [live_run_metrics(run) for run in runs]
        for i, j in itertools.combinations(range(len(runs)), 2):
            hours = _hours_apart(runs[i], runs[j])
            rows += [{"earlier": runs[i].path.parent.name, "later": runs[j].path.parent.name,
                      "tier": tier, "hours_apart": hours, "metric": m,
                      "earlier_value": metrics[i][m], "later_value": metrics[j][m],
                      "change": metric_error(m, metrics[i][m], metrics[j][m]),
                      "change_unit": error_unit(m)} for m in METRICS]
    return pd.DataFrame(rows)


def _hours_apart(first: Run, second: Run) -> float:
    """Hours from `first`'s start to `second`'s (meta.json's `started_utc`)."""
    return (pd.Timestamp(second.meta["started_utc"])
            - pd.Timestamp(first.meta["started_utc"])).total_seconds() / 3600


def replicate_score_table(profile: SimProfile, live_dir: str | Path | None = None,
                          tiers: tuple[str, ...] = LIVE_TIERS, parts: int = 1) -> pd.DataFrame:
    """The live stack scored as the twin is: for every two recordings of the fit command
    (`REPLICATES`) that hold a tier, the earlier one's metrics taken as the prediction of
    the later one's, against the null twin (`null_profile(profile)`) of the later one, in
    `compare_metrics`' rows (`run` "earlier->later"), with the hours between them. Why:
    `summary` of these rows is what a twin that reproduced one recording exactly would
    score on the next, in the units of the held-out goals (`GOALS`). With `parts` > 1 each
    recording's window is cut into that many (`window_parts`), each scored against the same
    part of the other (columns `part`, `window_s`): does a longer run agree better?"""
    root = Path(live_dir) if live_dir is not None else data_file("live")
    null, tables = null_profile(profile), []
    for tier in tiers:
        runs = [read_run(root / name / tier) for name in REPLICATES
                if (root / name / tier / "meta.json").exists()]
        scored = [[(w, *_replicate_metrics(run, null, w))
                   for w in window_parts(run_window(run), parts)] for run in runs]
        for i, j in itertools.combinations(range(len(runs)), 2):
            tables += _replicate_pair(runs[i], runs[j], scored[i], scored[j], tier)
    return pd.concat(tables, ignore_index=True)


def window_parts(window: Window, parts: int) -> list[Window]:
    """`window` cut into `parts` consecutive windows of equal length."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    step_s = window.length_s / parts
    return [Window(window.start_s + k * step_s, window.start_s + (k + 1) * step_s)
            for k in range(parts)]


def _replicate_pair(first: Run, second: Run, first_parts: list, second_parts: list,
                    tier: str) -> list[pd.DataFrame]:
    """`replicate_score_table`'s rows of one pair of recordings, part by part."""
    name = f"{first.path.parent.name}->{second.path.parent.name}"
    hours = _hours_apart(first, second)
    return [compare_metrics(later, earlier, later_null, name, tier).assign(
                hours_apart=hours, part=k, window_s=window.length_s)
            for k, ((_, earlier, _), (window, later, later_null))
            in enumerate(zip(first_parts, second_parts, strict=True))]


def _replicate_metrics(run: Run, null: SimProfile, window: Window
                       ) -> tuple[dict[str, float], dict[str, float]]:
    """A recording's live metrics and its null twin's over `window`, the L1 rows blank where
    the tier's L1 only passes the disk's chunks through (as `compare_run` has them)."""
    live = live_run_metrics(run, window)
    null_metrics, _, tier, _ = _sim_metrics(run, null, window)
    _blank_pass_through_l1(tier, live, null_metrics)
    return live, null_metrics


def replicate_score_summary(table: pd.DataFrame, tolerance: float = 10.0,
                            same_day_hours: float = 24.0) -> pd.DataFrame:
    """`summary` of `replicate_score_table` per pair of recordings (all tiers), then pooled
    over the pairs recorded within `same_day_hours` of each other and over all."""
    rows = [{"run": run, "hours_apart": part["hours_apart"].iloc[0],
             **summary(part, tolerance)} for run, part in table.groupby("run", sort=False)]
    for name, part in (("same day", table[table["hours_apart"] < same_day_hours]),
                       ("all", table)):
        rows.append({"run": name, "hours_apart": math.nan, **summary(part, tolerance)})
    return pd.DataFrame(rows)


def replicate_floor_by_window(profile: SimProfile, live_dir: str | Path | None = None,
                              parts: tuple[int, ...] = (1, 2, 3, 4), tolerance: float = 10.0,
                              same_day_hours: float = 24.0) -> pd.DataFrame:
    """The same-day pairs' pooled `summary` of `replicate_score_table` with each window cut
    into each of `parts`, one row per window length (`window_s`). Why: if two recordings
    disagreed only by chance within a window, the shorter windows would agree worse."""
    rows = []
    for n in parts:
        table = replicate_score_table(profile, live_dir, parts=n)
        same = table[table["hours_apart"] < same_day_hours]
        rows.append({"parts": n, "window_s": float(same["window_s"].median()),
                     **summary(same, tolerance)})
    return pd.DataFrame(rows)


def disturbance_table(runs: Mapping[str, list[str | Path]], profile: SimProfile
                      ) -> pd.DataFrame:
    """`decode_residuals` of every run folder, with the run name."""
    rows = [{"run": name, **decode_residuals(d, profile)}
            for name, dirs in runs.items() for d in dirs]
    return pd.DataFrame(rows)


GOALS = {"informative_within_10_share": 0.80, "median_abs_error": 5.0,
         "ttft_unsaturated_pct": 15.0, "ttft_saturated_pct": 25.0, "preemptions_pct": 25.0,
         "resume_ttft_pct": 20.0, "min_resumes": 30}
"""Issue 26's goals for the held-out runs: at least 80 % of the informative metrics within
10, median |error| <= 5; TTFT median and p90 within 15 % on every unsaturated run and 25 % on
the saturating one; preemptions within 25 %; resume TTFT within 20 % where a run has >= 30
resumes. Stated here once; `goal_table` checks them."""
SATURATING_SETS = ("b-saturating",)


def goal_table(table: pd.DataFrame, records: pd.DataFrame,
               runs: tuple[str, ...] = ()) -> pd.DataFrame:
    """Each of `GOALS` on the held-out rows of a validation table (`runs`, default
    `held_out_sets()`): what it asks, what the rows give, how many rows it judged, met or
    not."""
    held = table[table["run"].isin(runs or held_out_sets())]
    info = held[held["informative"].astype(bool)]
    out = [("informative metrics within 10", f">= {GOALS['informative_within_10_share']:.0%}",
            float((info["error"].abs() <= 10).mean()) if len(info) else math.nan, len(info),
            lambda v: v >= GOALS["informative_within_10_share"]),
           ("median |error| of the informative metrics", f"<= {GOALS['median_abs_error']:g}",
            float(info["error"].abs().median()) if len(info) else math.nan, len(info),
            lambda v: v <= GOALS["median_abs_error"])]
    ttft = held[held["metric"].isin(["ttft_median_s", "ttft_p90_s"])].dropna(subset=["error"])
    for saturated, limit in ((False, GOALS["ttft_unsaturated_pct"]),
                             (True, GOALS["ttft_saturated_pct"])):
        part = ttft[ttft["run"].map(set_of).isin(SATURATING_SETS) == saturated]
        out.append((f"TTFT median and p90, {'saturating' if saturated else 'unsaturated'} "
                    f"runs: worst |error|", f"<= {limit:g} %",
                    float(part["error"].abs().max()) if len(part) else math.nan, len(part),
                    lambda v, lim=limit: v <= lim))
    pre = held[held["metric"] == "preemptions"].dropna(subset=["error"])
    out.append(("preemptions: worst |error|", f"<= {GOALS['preemptions_pct']:g} %",
                float(pre["error"].abs().max()) if len(pre) else math.nan, len(pre),
                lambda v: v <= GOALS["preemptions_pct"]))
    live = records[(records["engine"] == "live") & records["run"].isin(runs or held_out_sets())]
    counts = live[live["is_resume"].astype(bool) & ~live["is_warmup"].astype(bool)].groupby(
        ["run", "tier"]).size()
    many = {key for key, n in counts.items() if n >= GOALS["min_resumes"]}
    judged = np.array([(r, t) in many for r, t in zip(held["run"], held["tier"], strict=True)],
                      dtype=bool)
    res = held[(held["metric"] == "resume_ttft_median_s").to_numpy() & judged]
    out.append((f"resume TTFT where >= {GOALS['min_resumes']} resumes: worst |error|",
                f"<= {GOALS['resume_ttft_pct']:g} %",
                float(res["error"].abs().max()) if len(res) else math.nan, len(res),
                lambda v: v <= GOALS["resume_ttft_pct"]))
    return pd.DataFrame([{"goal": g, "target": t, "value": v, "n_rows": n,
                          "met": bool(n and np.isfinite(v) and ok(v))}
                         for g, t, v, n, ok in out])


def process_table(runs: Mapping[str, list[str | Path]]) -> pd.DataFrame:
    """What each process of every live run folder did (`analysis.process_cpu`): CPUs busy
    and involuntary context switches per second by role, with the run and tier; how much
    the front CPU's processes (API server, engine core, LMCache server, client) competed."""
    parts = []
    for name, dirs in runs.items():
        for d in dirs:
            run = read_run(d)
            parts.append(process_cpu(run.samples).assign(run=name, tier=run.meta["tier"]))
    if not parts:
        return pd.DataFrame(columns=["run", "tier", "role", "cpu_busy", "ctx_involuntary_per_s"])
    return pd.concat(parts, ignore_index=True)[["run", "tier", "role", "cpu_busy",
                                                "ctx_involuntary_per_s"]]


def client_table(runs: Mapping[str, list[str | Path]]) -> pd.DataFrame:
    """The load client of each live run folder: its main thread's run-queue wait (seconds
    per second, and per timeslice in ms: how long it waited, runnable, each time it was to
    run), the autogroups the run's processes were in (0: not recorded, runs before
    2026-12-05 18:00) and the share of answers that reached it in one burst
    (`analysis.runs.token_delivery`). Why: in a session of its own, the server kept the
    client on its CPU waiting (`engines.live.processes.ManagedProcess`); this shows it in
    every recording."""
    rows = []
    for name, dirs in runs.items():
        for d in dirs:
            run = read_run(d)
            client = process_cpu(run.samples).set_index("role").reindex(["client"]).iloc[0]
            affinity = (run.meta.get("placement") or {}).get("affinity") or {}
            rows.append({"run": name, "tier": run.meta["tier"],
                         "autogroups": len(autogroups(affinity)),
                         "client_wait_per_s": client["runqueue_wait_per_s"],
                         "client_wait_per_slice_ms": 1e3 * client["wait_per_slice_s"],
                         "burst_share": token_delivery(run.records)["burst_share"]})
    return pd.DataFrame(rows, columns=["run", "tier", "autogroups", "client_wait_per_s",
                                       "client_wait_per_slice_ms", "burst_share"])


def _in_flight_at_send(records: pd.DataFrame) -> np.ndarray:
    """Per request: other requests of the run in the server when it was sent."""
    send, finish = records["send_s"].to_numpy(float), records["finish_s"].to_numpy(float)
    order = np.argsort(send)
    counts = np.empty(len(records), dtype=int)
    for rank, i in enumerate(order):
        counts[i] = int((finish[order[:rank]] > send[i]).sum())
    return counts


IN_FLIGHT_BINS = (-1, 0, 1, 2, 4, 8, 16, 1_000_000)


def ttft_by_load(live: pd.DataFrame, sim: pd.DataFrame) -> pd.DataFrame:
    """Live and simulated TTFT of the same requests by how many others were in flight when
    each was sent (live): where the twin's TTFT error comes from. Columns `in_flight, n,
    live_ttft_median_s, sim_ttft_median_s, error_pct`."""
    live = live[(live["error"].fillna("") == "") & live["first_token_s"].notna()].copy()
    live["in_flight"] = _in_flight_at_send(live)
    pairs = live[["session_id", "turn", "ttft_s", "in_flight"]].merge(
        sim[["session_id", "turn", "ttft_s"]], on=["session_id", "turn"],
        suffixes=("_live", "_sim"))
    labels = ["0", "1", "2", "3-4", "5-8", "9-16", ">16"]
    pairs["bin"] = pd.cut(pairs["in_flight"], IN_FLIGHT_BINS, labels=labels)
    out = pairs.groupby("bin", observed=True).agg(
        n=("ttft_s_live", "size"), live_ttft_median_s=("ttft_s_live", "median"),
        sim_ttft_median_s=("ttft_s_sim", "median")).reset_index()
    out["error_pct"] = [relative_error_pct(a, b) for a, b in
                        zip(out.live_ttft_median_s, out.sim_ttft_median_s, strict=True)]
    return out.rename(columns={"bin": "in_flight"})


SLOW_SCRAPE_S = 0.5
"""A sample whose scrape (vLLM's /metrics, then the process accounting) took longer than this
counts as slow: the API server or the client's loop was held up meanwhile."""


JOIN_KEYS = ["session_id", "turn"]  # a request of a run


LONE_HISTOGRAMS = {"queue_s": "queue_time", "prefill_s": "prefill_time",
                   "engine_ttft_s": "ttft"}  # lone_latency_s's column: vLLM's histogram


def queue_split(run_dir: str | Path, sim_records: pd.DataFrame) -> dict[str, float]:
    """Mean time before scheduling and mean TTFT, live (vLLM's own histograms: queue time,
    TTFT at the engine; the client's TTFT) and in the twin (`engine_queue_s` + `load_s`, TTFT).
    The client's TTFT minus the engine's is time outside vLLM's engine (HTTP, the API
    server's loop, the client); `live_slow_scrape_share` is the share of samples slower than
    `SLOW_SCRAPE_S`, a sign that the front end stalled."""
    run = read_run(run_dir)
    smp = run.samples

    def mean(name: str) -> float:
        total, count = smp[f"{name}_sum_s"], smp[f"{name}_count"]
        n = float(count.iloc[-1] - count.iloc[0])
        return float(total.iloc[-1] - total.iloc[0]) / n if n else math.nan

    lone = lone_latency_s(run.records, smp)["queue_s"]
    by_request = sim_records.set_index(JOIN_KEYS)
    sim_wait_s = by_request["engine_queue_s"] + by_request["load_s"]
    return {"tier": run.meta["tier"], "live_queue_ms": 1e3 * mean("queue_time"),
            "live_engine_ttft_ms": 1e3 * mean("ttft"),
            "live_client_ttft_ms": 1e3 * float(run.records["ttft_s"].mean()),
            "live_slow_scrape_share": float((smp["scrape_duration_s"] > SLOW_SCRAPE_S).mean()),
            "sim_queue_and_load_ms": 1e3 * float(sim_wait_s.mean()),
            "sim_ttft_ms": 1e3 * float(sim_records["ttft_s"].mean()),
            "lone_requests": len(lone),
            "live_lone_queue_ms": 1e3 * float(lone.median()),
            "sim_lone_queue_and_load_ms": 1e3 * float(sim_wait_s.reindex(lone.index).median())}


def lone_latency_s(records: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """vLLM's own latency split of each request that had the server to itself
    (`fit.isolated`) and was the only request to finish in its sample interval, indexed by
    (session_id, turn): `queue_s` (its engine core's scheduled minus queued time: what the
    twin spends on the lookup before scheduling), `prefill_s` (first token minus scheduled),
    `engine_ttft_s` (vLLM's TTFT, from the API server's arrival) and the client's `ttft_s`.
    vLLM observes these when the request finishes, so the interval's increase of each
    histogram's sum is this one request's (where each histogram counted one)."""
    alone = records[isolated(records)]
    time_s = samples["time_s"].to_numpy(float)
    ends = np.searchsorted(time_s, records["finish_s"].to_numpy(float))  # (t[i-1], t[i]]
    finishing = np.bincount(ends, minlength=len(time_s) + 1)
    i = np.searchsorted(time_s, alone["finish_s"].to_numpy(float))
    ok = (i > 0) & (i < len(time_s))
    i = np.where(ok, i, 1)
    ok &= finishing[i] == 1
    split = {}
    for column, name in LONE_HISTOGRAMS.items():
        total, count = (samples[f"{name}_{c}"].to_numpy(float) for c in ("sum_s", "count"))
        ok &= count[i] - count[i - 1] == 1
        split[column] = total[i] - total[i - 1]
    out = pd.DataFrame(split, index=pd.MultiIndex.from_frame(alone[JOIN_KEYS]))
    out["ttft_s"] = alone["ttft_s"].to_numpy(float)
    return out[ok]


def before_scheduling_s(run: Run, result: SimResult) -> tuple[pd.Series, pd.Series]:
    """Per request of `lone_latency_s`: the time before scheduling, live (vLLM's queue time:
    a lone request's lookup and load) and in the twin replaying the run (its queue and
    load)."""
    lone = lone_latency_s(run.records, run.samples)
    sim = result.records.set_index(JOIN_KEYS).reindex(lone.index)
    return lone["queue_s"], sim["queue_s"] + sim["load_s"]


def lone_split(run: Run, result: SimResult, profile: SimProfile) -> dict[str, Any]:
    """Where the TTFT of `lone_latency_s`'s requests goes, live and in the twin replaying
    the run (`simulate_replay`), medians in ms: the front end (live, the client's TTFT less
    vLLM's queue and prefill time; the twin's `ServerProfile.front_end_s`), before
    scheduling (vLLM's queue time; the twin's queue and load) and after it (vLLM's prefill
    time, scheduled to first token; the twin's rest). Tells a fitted cost the twin spends
    before scheduling from one live spends after it."""
    lone = lone_latency_s(run.records, run.samples)
    sim = result.records.set_index(JOIN_KEYS).reindex(lone.index)
    server = profile_for_run(profile, run.meta).server_for(run.meta["tier"])
    front = server.front_end_s(sim["prompt_tokens"], sim["front_stretch"])
    wait = sim["queue_s"] + sim["load_s"]
    parts = {"front_end": (lone["ttft_s"] - lone["queue_s"] - lone["prefill_s"], front),
             "before_scheduling": before_scheduling_s(run, result),
             "after_scheduling": (lone["prefill_s"], sim["ttft_s"] - front - wait)}
    out: dict[str, Any] = {"tier": run.meta["tier"], "lone_requests": len(lone)}
    for name, (live, twin) in parts.items():
        out[f"live_{name}_ms"] = 1e3 * float(live.median())
        out[f"sim_{name}_ms"] = 1e3 * float(twin.median())
    return out


def ttft_by_load_table(records: pd.DataFrame,
                       pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """`ttft_by_load` for each (run, tier) of `pairs`, from `validation_table`'s records."""
    def part(engine: str, run: str, tier: str) -> pd.DataFrame:
        return records[(records.engine == engine) & (records.run == run)
                       & (records.tier == tier)]
    return pd.concat([ttft_by_load(part("live", r, t), part("sim", r, t)).assign(run=r, tier=t)
                      for r, t in pairs], ignore_index=True)


def queue_table(runs: Mapping[str, list[str | Path]], records: pd.DataFrame) -> pd.DataFrame:
    """`queue_split` of every run folder, with the twin's records from `validation_table`."""
    sim = records[records.engine == "sim"]
    rows = [{"run": name, **queue_split(d, sim[(sim.run == name) & (sim.tier == Path(d).name)])}
            for name, dirs in runs.items() for d in dirs]
    return pd.DataFrame(rows)


def within(table: pd.DataFrame, tolerance: float = 20.0) -> pd.Series:
    """Mask of table rows whose |error| (% or pp) is within the tolerance (NaN: False)."""
    return table["error"].abs() <= tolerance


def summary(table: pd.DataFrame, tolerance: float = 10.0) -> dict[str, float]:
    """How the twin did over a table's informative rows (see the module doc): how many,
    how many within the tolerance, the median |error| and the worst one (each in its
    row's unit, % or pp); `n_not_informative` judged rows the null twin also got within
    `NULL_MARGIN`, shown in the table but not counted."""
    judged = table[table["error"].notna()]
    errors = judged.loc[judged["informative"].astype(bool), "error"].abs()
    return {"n_metrics": int(len(errors)), "n_within": int((errors <= tolerance).sum()),
            "n_not_informative": int(len(judged) - len(errors)),
            "median_abs_error": float(errors.median()) if len(errors) else math.nan,
            "max_abs_error": float(errors.max()) if len(errors) else math.nan}


def summary_table(table: pd.DataFrame, tolerance: float = 10.0) -> pd.DataFrame:
    """`summary` per run, then for each draw's held-out sets together (when the table has
    them; rows `held-out`, `held-out-redrawn`, ..., `held-out-fifth`) and every
    run (`all`)."""
    parts = [(run, part) for run, part in table.groupby("run", sort=False)]
    for _, suffix in DRAWS:
        drawn = table[table["run"].isin([redrawn(n, suffix) for n in held_out_sets()])]
        if len(drawn) or not suffix:
            parts.append((redrawn("held-out", suffix), drawn))
    parts += [("all", table)]
    return pd.DataFrame([{"run": run, **summary(part, tolerance)} for run, part in parts])


def draw_report(table: pd.DataFrame, records: pd.DataFrame, suffix: str = REDRAWN_SUFFIX,
                tolerance: float = 10.0) -> str:
    """One draw of the held-out sets scored (`DRAWS`; `table`'s `error` is what is scored,
    e.g. the committed predictions'): a line per recorded set and one for the draw, then
    `goal_table` on its runs; what each draw's section of notebook 06 prints."""
    runs = tuple(redrawn(s, suffix) for s in held_out_sets())
    scored = summary_table(table, tolerance).set_index("run")
    lines = [f"{name}: {row.n_within:.0f} of {row.n_metrics:.0f} informative within "
             f"{tolerance:g}, median |error| {row.median_abs_error:.1f}"
             for name, row in scored.iterrows()
             if name in runs + (redrawn("held-out", suffix),)]
    if any(name in scored.index for name in runs):
        lines.append(goal_table(table, records, runs=runs).round(3).to_string(index=False))
    return "\n".join(lines)


# ---------------------------------------------------------------- the fit guard

FITTED_PARAMETERS = ("fp16_tflops", "mem_bw_tb_s", "step_overhead_s", "front_end_latency_s",
                     "dram.twin_lookup_s", "dram.twin_connector_step_s",
                     "dram.twin_connector_request_s", "dram.twin_connector_token_s",
                     "dram.dram.read_bw_bytes_s",
                     "flash.twin_lookup_s", "flash.twin_connector_step_s",
                     "flash.twin_connector_request_s", "flash.twin_connector_token_s",
                     "flash.flash.read_bw_bytes_s")
"""The twin's numbers fitted (and the lookups measured) on `FIT_RUN` (`kvrepro.calibration
.fit`, `fit_offload`), named as `profile_yaml.fitted_parameters` names them: a server
field, `<tier>.<field>` or `<tier>.<store>.read_bw_bytes_s`."""
GUARD_METRICS = ("ttft_median_s", "ttft_light_median_s", "decode_step_mean_s",
                 "loaded_ttft_median_s", "decode_step_all_mean_s",
                 "decode_step_per_context_token_s", "lone_queue_median_s")
"""What the fit is responsible for, per tier of the fit run (`fit_guard_metrics`)."""
GUARD_TIERS = {"decode_step_per_context_token_s": ("small-kv",),
               "lone_queue_median_s": ("dram", "flash")}
"""Guard metrics read on some tiers only: each is the statistic one fitted or measured
constant was taken from, on the tier it was taken on. The decode step's slope in the context
(`fit.fit_decode`: `mem_bw_tb_s` is the KV bytes per token over it) on the baseline; vLLM's
queue time of the lone requests a sample interval isolates (`lone_latency_s`: the lookups
are the medians of it, `fit_offload.measured_costs`) on the LMCache tiers. Why rows of their
own: a 30 % move of either constant moves the TTFT and mean step rows by 2-4 %, within
their tolerance; it moves its own statistic by 20-45 %."""


def guard_metrics(tier: str) -> tuple[str, ...]:
    """`GUARD_METRICS` read on `tier` (`GUARD_TIERS`; every tier where not listed)."""
    return tuple(m for m in GUARD_METRICS if tier in GUARD_TIERS.get(m, LIVE_TIERS))


def parameter_value(profile: SimProfile, parameter: str) -> float:
    """The value of one of `FITTED_PARAMETERS` in `profile`."""
    parts = parameter.split(".")
    if len(parts) == 1:
        return float(getattr(profile.server, parameter))
    tier = profile.tiers[parts[0]]
    if len(parts) == 2:
        return float(getattr(tier, parts[1]))
    store = next(s for s in tier.stores if s.name == parts[1])
    return float(getattr(store, parts[2]))


def scaled_profile(profile: SimProfile, parameter: str, factor: float) -> SimProfile:
    """`profile` with one of `FITTED_PARAMETERS` multiplied by `factor`."""
    parts = parameter.split(".")
    if len(parts) == 1:
        server = profile.server.model_copy(
            update={parameter: getattr(profile.server, parameter) * factor})
        return profile.model_copy(update={"server": server})
    tiers = dict(profile.tiers)
    tier = tiers[parts[0]]
    if len(parts) == 2:
        tiers[parts[0]] = tier.model_copy(update={parts[1]: getattr(tier, parts[1]) * factor})
    else:
        stores = [s.model_copy(update={parts[2]: getattr(s, parts[2]) * factor})
                  if s.name == parts[1] else s for s in tier.stores]
        tiers[parts[0]] = tier.model_copy(update={"stores": stores})
    return profile.model_copy(update={"tiers": tiers})


def _paired(live: pd.DataFrame, sim: pd.DataFrame) -> pd.DataFrame:
    """Live requests joined with the twin's same (session, turn)."""
    cols = ["session_id", "turn", "ttft_s", "first_token_s", "finish_s", "output_tokens"]
    extra = [c for c in sim.columns if c.startswith("loaded_tokens_")]
    return live.merge(sim[cols + extra], on=["session_id", "turn"], suffixes=("", "_sim"))


def _step_s(rows: pd.DataFrame, suffix: str) -> pd.Series:
    """Mean decode step time per request (live: suffix "", twin: "_sim")."""
    return ((rows[f"finish_s{suffix}"] - rows[f"first_token_s{suffix}"])
            / (rows[f"output_tokens{suffix}"] - 1))


def fit_guard_metrics(run: Run, result: SimResult) -> list[dict[str, Any]]:
    """Live and twin values of `GUARD_METRICS` on one fit-run tier, paired request by
    request: the median TTFT of the requests alone on the server live (the fit's points:
    `fit.isolated`) and in the twin (one the twin queues behind another is a scheduling
    question, the held-out runs' business), of the lighter half of them by computed prompt
    tokens (front end and lookup weigh most there) and of those the twin loaded from an
    offload store; the mean decode step time of the lone requests and of every request (the
    connector's per-running-request cost). Rows (metric, live, sim, n).

    TTFT rows are medians because what they check is: the prefill and front-end lines are
    Theil-Sen (median) lines, the lookup and per-token connector cost medians of vLLM's own
    per-request split (`fit_offload.measured_costs`); a few lone TTFTs 5-20x the rest move a
    mean by 10-16 % and none of these. The decode rows stay means (the decode lines are
    fitted through every step)."""
    rec = run.records
    ok = rec[(rec["error"].fillna("") == "") & rec["first_token_s"].notna()]
    twin = result.records
    lone = _paired(rec[isolated(rec)], twin[isolated(twin)])
    computed = lone["prompt_tokens"] - lone["cached_prompt_tokens"].fillna(0)
    loaded = sum((lone[c].fillna(0) for c in lone.columns if c.startswith("loaded_tokens_")),
                 start=pd.Series(0.0, index=lone.index))
    every = _paired(ok, twin)
    parts = {"ttft_median_s": (lone, "ttft"),
             "ttft_light_median_s": (lone[computed <= computed.median()], "ttft"),
             "decode_step_mean_s": (lone[lone["output_tokens"] > MIN_DECODE_STEPS], "step"),
             "loaded_ttft_median_s": (lone[loaded > 0], "ttft"),
             "decode_step_all_mean_s": (every[every["output_tokens"] > MIN_DECODE_STEPS],
                                        "step")}
    rows = []
    for metric, (part, kind) in parts.items():
        live = part["ttft_s"] if kind == "ttft" else _step_s(part, "")
        sim = part["ttft_s_sim"] if kind == "ttft" else _step_s(part, "_sim")
        how = "median" if kind == "ttft" else "mean"
        rows.append({"metric": metric, "live": float(live.agg(how)) if len(part) else math.nan,
                     "sim": float(sim.agg(how)) if len(part) else math.nan, "n": len(part)})
    wanted = guard_metrics(run.meta["tier"])
    if "decode_step_per_context_token_s" in wanted:
        fit_points = _paired(rec[isolated(rec)], twin)  # the decode fit's: alone live
        rows.append(_context_slope_row(fit_points[fit_points["output_tokens"]
                                                  > MIN_DECODE_STEPS]))
    if "lone_queue_median_s" in wanted:
        live, twin = before_scheduling_s(run, result)
        rows.append({"metric": "lone_queue_median_s", "live": float(live.median()),
                     "sim": float(twin.median()), "n": len(live)})
    return rows


def _context_slope_row(lone: pd.DataFrame) -> dict[str, Any]:
    """The Theil-Sen slope of the lone requests' mean decode step in their context
    (`fit.decode_context_tokens`), live and in the twin: the decode fit's own statistic, on
    its own points (`fit.decode_points`: alone live, whether or not alone in the twin)."""
    x = decode_context_tokens(lone).to_numpy(float)
    slope = {side: line_fit(x, _step_s(lone, suffix).to_numpy(float), "fit guard")[1]
             for side, suffix in (("live", ""), ("sim", "_sim"))}
    return {"metric": "decode_step_per_context_token_s", **slope, "n": len(lone)}


def replay_workload(workload: Workload, records: pd.DataFrame, end_s: float) -> Workload:
    """`workload` with every turn sent when the live run sent it (`not_before_s` = the live
    `send_s`, no pause; a turn the live run never sent goes after `end_s`, i.e. not at all).

    Why: in the closed loop a twin's session drifts from the live one turn by turn, so a
    request that ran alone live may share the twin's server with others; replaying the live
    send times keeps the lone requests alone, and what is left is the step model the fit
    is responsible for."""
    sent = records.set_index(["session_id", "turn"])["send_s"]
    keys = pd.MultiIndex.from_frame(workload.turns[["session_id", "turn"]])
    send_s = sent.reindex(keys).to_numpy(float)
    turns = workload.turns.assign(pause_s=0.0,
                                  not_before_s=np.where(np.isfinite(send_s), send_s,
                                                        end_s + 1.0))
    return Workload(spec=workload.spec, sessions=workload.sessions, turns=turns,
                    tokens=workload.tokens)


def simulate_replay(run: Run, profile: SimProfile) -> SimResult:
    """The twin on a live run's tier as deployed, its requests sent at the live send times
    (`replay_workload`)."""
    deployed = profile_for_run(profile, run.meta)
    end_s = run_seconds(run)
    workload = replay_workload(workload_of(run), run.records, end_s)
    return simulate(workload, deployed, run.meta["tier"], duration_s=end_s,
                    warmup_s=float(run.meta.get("options", {}).get("warmup_s", 0.0)),
                    progress=False)


def fit_guard_table(profile: SimProfile, fit_dir: str | Path | None = None,
                    tiers: tuple[str, ...] = ("small-kv", "dram", "flash")) -> pd.DataFrame:
    """`fit_guard_metrics` of every tier of the fit run (`FIT_RUN` under the package's
    data/live by default) on `profile`: rows tier, metric, live, sim, n, error_pct."""
    root = Path(fit_dir) if fit_dir is not None else data_file("live", FIT_RUN)
    rows = []
    for name in tiers:
        run = read_run(root / name)
        result = simulate_replay(run, profile)
        rows += [{"tier": name, **row} for row in fit_guard_metrics(run, result)]
    table = pd.DataFrame(rows)
    table["error_pct"] = [relative_error_pct(a, b) for a, b in
                          zip(table["live"], table["sim"], strict=True)]
    return table


__all__ = ["FITTED_PARAMETERS", "FIT_RUN", "GOALS", "GUARD_METRICS", "HELD_OUT_ROOT", "JOIN_KEYS",
           "REDRAWN_ROOT", "REDRAWN_SUFFIX", "THIRD_ROOT", "THIRD_SUFFIX", "FOURTH_ROOT",
           "FOURTH_SUFFIX", "FIFTH_ROOT", "FIFTH_SUFFIX", "SIXTH_ROOT", "SIXTH_SUFFIX",
           "SEVENTH_ROOT", "SEVENTH_SUFFIX", "EIGHTH_ROOT", "EIGHTH_SUFFIX",
           "DRAWS", "ONE_SESSION_FIT",
           "machine_adjusted", "machine_table", "machine_whatif_table",
           "client_table", "redrawn",
           "set_of", "DRIFT_ROOT", "drift_table",
           "REPLICATES", "replicate_conditions", "replication_table", "replicate_score_table",
           "replicate_score_summary", "replicate_floor_by_window", "window_parts",
           "live_run_metrics",
           "LIVE_TIERS", "METRICS", "NULL_MARGIN", "NULL_SPEEDUP",
           "SATURATING_SETS", "SHARE_METRICS", "SLOW_SCRAPE_S", "TABLE_COLUMNS",
           "RunComparison", "Window",
           "check_placement", "compare_metrics", "compare_run", "counter_increase",
           "decode_residuals", "disturbance_table", "draw_report", "error_unit",
           "fit_guard_metrics", "guard_metrics", "GUARD_TIERS", "before_scheduling_s",
           "fit_guard_table", "goal_table", "held_out_sets", "is_informative",
           "live_counter_metrics", "live_offload_metrics", "metric_error", "null_profile",
           "parameter_value", "lone_decode_step_ms", "lone_latency_s", "lone_split",
           "planned_run",
           "predicted_metrics", "process_table", "profile_for_run", "queue_split",
           "REDEFINED_METRICS", "redefined_since",
           "queue_table", "relative_error_pct", "replay_workload", "run_metrics", "run_seconds",
           "run_window", "scaled_profile", "shipped_runs", "sim_counter_metrics",
           "sim_offload_metrics", "simulate_replay", "simulate_run", "summary", "summary_table",
           "ttft_by_load", "ttft_by_load_table", "validation_table", "window_requests",
           "window_samples", "within", "workload_of"]
