"""Validate the digital twin against a live run: same workload, same tier, the same metrics.

For each live run folder the workload is regenerated from its `meta.json` (the digest must
match, else the comparison would be of two different loads), simulated on the server spec's
twin with the run's own tier as it was deployed (`profile_for_run`: the engine's KV budget and
scheduler limits from the run's tier config, the offload stores of the spec's tier of that
name with LMCache's L1 size and disk limit from the config), and both runs are reduced to the
same numbers with `kvrepro.analysis.runs` (`METRICS`):

* `ttft_median_s`, `ttft_p90_s`: TTFT of successful requests sent after the warm-up (the
  steady state, as study A reads TTFT);
* `total_tok_s`, `output_tok_s`: prompt (cached included) + output tokens, and output tokens,
  per second over the run (one bin of the run's duration);
* `cached_share`: cached prompt tokens / prompt tokens (`analysis.prompt_split`);
* `l1_hit_share`, `l2_hit_share`: prompt tokens loaded from the offload tier's first store
  (LMCache's L1) and from its second (the disk, L2), over all prompt tokens: from the
  servers' counters live (`analysis.prompt_tokens_by_source`), from the records' per-store
  loaded tokens in the twin;
* `l1_fill_s`: the first eviction from L1 (`analysis.fill_time_s`: LMCache's eviction counter
  live, the store's stats in the twin); NaN where it never evicted;
* `resume_ttft_median_s`: median TTFT of the resumes (first turn after a long idle) sent after
  the warm-up (`analysis.resume_stats`).

The live client measures TTFT from its own send, so it includes the API server's
per-request latency (HTTP, JSON, input processing, streaming), which the simulated engine
core does not model; the profile's `server.front_end_latency_s` (fitted by
`kvrepro.calibration.fit`) puts it on the simulated first-token and finish times, and so into the
closed loop of each simulated session.

`error_pct` = 100 x (sim - live) / live; NaN where live is 0 or either value is missing (a
baseline has no offload hits, a run whose L1 never filled has no fill time).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvrepro._paths import data_file
from kvrepro.analysis.runs import (
    fill_time_s,
    prompt_split,
    prompt_tokens_by_source,
    resume_stats,
    throughput_over_time,
    ttft_over_time,
)
from kvrepro.calibration.fit import isolated
from kvrepro.engines.sim.config import SimProfile, SimTier
from kvrepro.engines.sim.engine import SimResult, simulate
from kvrepro.records import Run, read_run
from kvrepro.workload import build_workload
from kvrepro.workload.base import Workload

METRICS = ("ttft_median_s", "ttft_p90_s", "total_tok_s", "output_tok_s", "cached_share",
           "l1_hit_share", "l2_hit_share", "l1_fill_s", "resume_ttft_median_s")
TABLE_COLUMNS = ("run", "tier", "metric", "live", "sim", "error_pct")
LIVE_L1_BYTES = "lmcache_l1_bytes_used"
"""Live samples' L1 column: LMCache's `lmcache_l1_evicted_chunks` counter goes with it."""


@dataclass
class RunComparison:
    """One live run next to its simulation: the table rows and both record sets."""

    table: pd.DataFrame
    live_records: pd.DataFrame
    sim_records: pd.DataFrame
    sim_stats: dict
    sim_wall_s: float


def _core_metrics(records: pd.DataFrame, run_s: float) -> dict[str, float]:
    """TTFT, throughput, cached share and resume TTFT of one tier's records."""
    if records["tier"].nunique() != 1:
        raise ValueError(f"run_metrics: expected one tier, got {sorted(records.tier.unique())}")
    ttft = ttft_over_time(records, bin_s=run_s, exclude_warmup=True, run_s=run_s).iloc[0]
    rates = throughput_over_time(records, bin_s=run_s, run_s=run_s).iloc[0]
    resume = resume_stats(records).iloc[0]
    return {"ttft_median_s": float(ttft["ttft_median_s"]),
            "ttft_p90_s": float(ttft["ttft_p90_s"]), "total_tok_s": float(rates["total_tok_s"]),
            "output_tok_s": float(rates["output_tok_s"]),
            "cached_share": float(prompt_split(records)["hit_share"].iloc[0]),
            "resume_ttft_median_s": float(resume["resume_ttft_median_s"])}


def live_offload_metrics(samples: pd.DataFrame) -> dict[str, float]:
    """L1 / L2 hit shares and L1 fill time of a live run, from its servers' counters."""
    if samples.empty or "prompt_tokens_local_compute" not in samples:
        return {"l1_hit_share": float("nan"), "l2_hit_share": float("nan"),
                "l1_fill_s": float("nan")}
    src = prompt_tokens_by_source(samples).iloc[0]
    total = src["computed_tokens"] + src["engine_hit_tokens"] + src["offload_hit_tokens"]
    offload = src["offload_hit_tokens"]
    l1 = src["offload_l1_tokens"] if offload else 0.0
    l2 = src["offload_l2_tokens"] if offload else 0.0
    fill = (fill_time_s(samples, LIVE_L1_BYTES) if LIVE_L1_BYTES in samples
            else float("nan"))
    return {"l1_hit_share": float(l1 / total), "l2_hit_share": float(l2 / total),
            "l1_fill_s": fill}


def sim_offload_metrics(result: SimResult, tier: SimTier) -> dict[str, float]:
    """L1 / L2 hit shares (the records' loaded tokens per store) and L1 fill time (stats)."""
    records, names = result.records, [s.name for s in tier.stores]
    total = float(records["prompt_tokens"].sum())

    def share(i: int) -> float:
        column = f"loaded_tokens_{names[i]}" if i < len(names) else ""
        return float(records[column].sum() / total) if column in records else 0.0

    fill = float("nan")
    if names:
        fill = fill_time_s(result.samples, f"{names[0]}_bytes_used", stats=result.stats)
    return {"l1_hit_share": share(0), "l2_hit_share": share(1), "l1_fill_s": fill}


def run_metrics(records: pd.DataFrame, run_s: float,
                offload: Mapping[str, float] | None = None) -> dict[str, float]:
    """The validation metrics of one run's records (one tier), see the module doc; the
    offload metrics come from `live_offload_metrics` / `sim_offload_metrics` (NaN if None)."""
    nan = {m: float("nan") for m in ("l1_hit_share", "l2_hit_share", "l1_fill_s")}
    out = {**_core_metrics(records, run_s), **(offload or nan)}
    return {m: out[m] for m in METRICS}


def relative_error_pct(live: float, sim: float) -> float:
    """100 x (sim - live) / live; NaN when live is 0 or either value is missing."""
    if not np.isfinite(live) or not np.isfinite(sim) or live == 0:
        return float("nan")
    return 100.0 * (sim - live) / live


def compare_metrics(live: Mapping[str, float], sim: Mapping[str, float], run: str,
                    tier: str) -> pd.DataFrame:
    """Tidy rows (run, tier, metric, live, sim, error_pct) for every metric in METRICS."""
    rows = [{"run": run, "tier": tier, "metric": m, "live": live[m], "sim": sim[m],
             "error_pct": relative_error_pct(live[m], sim[m])} for m in METRICS]
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


def _deployed_tier(profile: SimProfile, config: Mapping[str, Any], tier: str) -> SimTier:
    """The spec's tier `tier` with LMCache's sizes as the run deployed them (L1 GiB, disk
    limit GB from the rendered `lmcache_mp` settings); a tier the spec lacks is a baseline."""
    if tier not in profile.tiers:
        return SimTier(name=tier)
    sim_tier = profile.tiers[tier].model_copy(deep=True, update={"kv_cache_bytes": None})
    mp = config.get("lmcache_mp") or {}
    stores = sim_tier.stores
    if mp and stores:
        stores[0] = stores[0].model_copy(update={"capacity_bytes": mp["l1_size_gib"] * 2**30})
        for store, adapter in zip(stores[1:], mp.get("l2_adapters") or [], strict=False):
            if adapter.get("max_capacity_gb"):
                store.capacity_bytes = adapter["max_capacity_gb"] * 2**30
    return sim_tier


def profile_for_run(profile: SimProfile, meta: Mapping) -> SimProfile:
    """A copy of `profile` serving the live run's tier as deployed: its KV budget and
    scheduler limits (exact, from `meta["tier_config"]`) and the spec's tier of that name
    with the run's LMCache sizes (`_deployed_tier`); a name the spec lacks gets no offload."""
    config, tier = meta["tier_config"], meta["tier"]
    updates = {"kv_cache_bytes": float(config["kv_cache_memory_bytes"]),
               "max_num_batched_tokens": int(config["max_num_batched_tokens"]),
               "max_model_len": int(config["max_model_len"])}
    if config.get("max_num_seqs"):
        updates["max_num_seqs"] = int(config["max_num_seqs"])
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


def compare_run(run_dir: str | Path, profile: SimProfile,
                run_name: str | None = None) -> RunComparison:
    """Simulate one live run's workload on its tier and compare every metric."""
    run = read_run(run_dir)
    run_s = run_seconds(run)
    result, deployed, wall_s = simulate_run(run, profile)
    tier = deployed.tier(run.meta["tier"])
    live = run_metrics(run.records, run_s, live_offload_metrics(run.samples.assign(
        tier=run.meta["tier"])) if not run.samples.empty else None)
    sim = run_metrics(result.records, run_s, sim_offload_metrics(result, tier))
    if tier.skip_l1:  # LMCache's L1 only passes the disk's chunks through: no L1 hits, and
        for metric in ("l1_hit_share", "l1_fill_s"):  # its evictions are churn, not a fill
            live[metric] = sim[metric] = float("nan")
    name = run_name or Path(run_dir).resolve().parent.name
    table = compare_metrics(live, sim, name, run.meta["tier"])
    return RunComparison(table, run.records, result.records, result.stats, wall_s)


def validation_table(runs: Mapping[str, list[str | Path]], profile: SimProfile
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Compare every tier folder of every named run: (table, live + sim records).

    `runs` maps a run name (e.g. "fit", "held-out") to its tier folders. The records frame
    has both engines' records with a `run` column, for CDFs or other figures.
    """
    tables, records = [], []
    for name, tier_dirs in runs.items():
        for tier_dir in tier_dirs:
            cmp = compare_run(tier_dir, profile, run_name=name)
            tables.append(cmp.table)
            records += [cmp.live_records.assign(run=name), cmp.sim_records.assign(run=name)]
    return (pd.concat(tables, ignore_index=True),
            pd.concat(records, ignore_index=True, sort=False))


FIT_RUN = "cpu_tiny_fit"
"""The live campaign the tiny server's twin is fitted on (data/live/<FIT_RUN>)."""
EARLIER_RUN = "cpu_tiny_lmcache"
"""The same shape run hours earlier for 10 minutes (notebook 12's data): not fitted on; it
shows how much the machine itself drifted between sessions."""
HELD_OUT_ROOT = "cpu_tiny_validation"
HELD_OUT_SETS = ("a-seed-rate", "b-saturating", "c-l1-cap")
"""Held-out campaigns (data/live/cpu_tiny_validation/<set>), never used for fitting: another
seed and session rate; a saturating load; another L1 size and context cap."""
LIVE_TIERS = ("small-kv", "dram", "flash")


def shipped_runs(live_dir: str | Path | None = None,
                 tiers: tuple[str, ...] = LIVE_TIERS) -> dict[str, list[Path]]:
    """The fit run and the held-out runs, tier folders by run name (`validation_table`'s
    input); `live_dir` defaults to the package's data/live."""
    root = Path(live_dir) if live_dir is not None else data_file("live")
    runs = {"fit": [root / FIT_RUN / t for t in tiers]}
    for name in HELD_OUT_SETS:
        runs[name] = [root / HELD_OUT_ROOT / name / t for t in tiers]
    runs["earlier"] = [root / EARLIER_RUN / t for t in tiers]
    return runs


def decode_residuals(run_dir: str | Path, profile: SimProfile) -> dict[str, Any]:
    """How far a live run's lone decode steps sit from the twin's step model: a check that
    the machine was quiet (other work on the 2 cores slows every step; no engine model can
    predict that). Lone requests with more than 4 output tokens; residual = live mean step
    time - (overhead + connector costs + weights and KV at the fitted rate)."""
    run = read_run(run_dir)
    deployed = profile_for_run(profile, run.meta)
    s, t = deployed.server, deployed.tier(run.meta["tier"])
    rec = run.records
    lone = rec[isolated(rec) & (rec["output_tokens"] > 4)]
    model = s.model_spec()
    ctx = lone["prompt_tokens"] + lone["output_tokens"] / 2
    step_s = (s.step_overhead_s + t.twin_connector_step_s + t.twin_connector_request_s
              + (model.active_weight_bytes + ctx * model.kv_bytes_per_token)
              / (s.mem_bw_tb_s * 1e12 * s.decode_efficiency))
    res_s = (lone["finish_s"] - lone["first_token_s"]) / (lone["output_tokens"] - 1) - step_s
    return {"tier": run.meta["tier"], "n_lone": int(len(lone)),
            "decode_residual_median_ms": float(1e3 * res_s.median()),
            "decode_residual_p90_ms": float(1e3 * res_s.quantile(0.9)),
            "share_over_1ms": float((res_s > 0.001).mean()) if len(res_s) else math.nan}


def disturbance_table(runs: Mapping[str, list[str | Path]], profile: SimProfile
                      ) -> pd.DataFrame:
    """`decode_residuals` of every run folder, with the run name."""
    rows = [{"run": name, **decode_residuals(d, profile)}
            for name, dirs in runs.items() for d in dirs]
    return pd.DataFrame(rows)


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


def queue_split(run_dir: str | Path, sim_records: pd.DataFrame) -> dict[str, float]:
    """Mean time before scheduling and mean TTFT, live (vLLM's own histograms: queue time,
    TTFT at the engine; the client's TTFT) and in the twin (`queue_s` + `load_s`, TTFT)."""
    run = read_run(run_dir)
    smp = run.samples

    def mean(name: str) -> float:
        total, count = smp[f"{name}_sum_s"], smp[f"{name}_count"]
        n = float(count.iloc[-1] - count.iloc[0])
        return float(total.iloc[-1] - total.iloc[0]) / n if n else math.nan

    return {"tier": run.meta["tier"], "live_queue_ms": 1e3 * mean("queue_time"),
            "live_engine_ttft_ms": 1e3 * mean("ttft"),
            "live_client_ttft_ms": 1e3 * float(run.records["ttft_s"].mean()),
            "sim_queue_and_load_ms": 1e3 * float((sim_records["queue_s"]
                                                  + sim_records["load_s"]).mean()),
            "sim_ttft_ms": 1e3 * float(sim_records["ttft_s"].mean())}


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


def within(table: pd.DataFrame, tolerance_pct: float = 20.0) -> pd.Series:
    """Mask of table rows whose |error_pct| is within the tolerance (NaN: not judged, False)."""
    return table["error_pct"].abs() <= tolerance_pct


def summary(table: pd.DataFrame, tolerance_pct: float = 10.0) -> dict[str, float]:
    """How the twin did over a table: rows with an error, how many within the tolerance,
    the median |error| and the worst one."""
    errors = table["error_pct"].dropna().abs()
    return {"n_metrics": int(len(errors)), "n_within": int((errors <= tolerance_pct).sum()),
            "median_abs_error_pct": float(errors.median()) if len(errors) else math.nan,
            "max_abs_error_pct": float(errors.max()) if len(errors) else math.nan}


def summary_table(table: pd.DataFrame, tolerance_pct: float = 10.0) -> pd.DataFrame:
    """`summary` per run, then for the held-out runs (a)-(c) together and for every run
    (rows `held-out` and `all`)."""
    held = table[table["run"].isin(HELD_OUT_SETS)]
    parts = [(run, part) for run, part in table.groupby("run", sort=False)]
    parts += [("held-out", held), ("all", table)]
    return pd.DataFrame([{"run": run, **summary(part, tolerance_pct)} for run, part in parts])


__all__ = ["EARLIER_RUN", "FIT_RUN", "HELD_OUT_ROOT", "HELD_OUT_SETS", "LIVE_TIERS", "METRICS",
           "TABLE_COLUMNS", "RunComparison", "compare_metrics", "compare_run", "decode_residuals",
           "disturbance_table", "live_offload_metrics", "profile_for_run", "queue_split",
           "queue_table", "relative_error_pct", "run_metrics", "run_seconds", "shipped_runs",
           "sim_offload_metrics", "simulate_run", "summary", "summary_table", "ttft_by_load",
           "ttft_by_load_table", "validation_table", "within", "workload_of"]
