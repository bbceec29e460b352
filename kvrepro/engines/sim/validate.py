"""Validate the digital twin against a live run: same workload, same tier, four metrics.

For each live run folder the workload is regenerated from its `meta.json` (the digest must
match, else the comparison would be of two different loads), simulated on a profile whose
KV budget and scheduler limits come from the run's own tier config (`profile_for_run`), and
both record sets are reduced to the same four numbers with `kvrepro.analysis.runs`:

* `ttft_median_s`, `ttft_p90_s`: TTFT of successful requests sent after the warm-up (the
  steady state, as study A reads TTFT);
* `total_tok_s`: prompt (cached included) + output tokens per second over the run
  (`analysis.throughput_over_time` with one bin of the run's duration);
* `cached_share`: cached prompt tokens / prompt tokens (`analysis.prompt_split`).

The live client measures TTFT from its own send, so it includes the API server's
per-request latency (HTTP, JSON, input processing, streaming), which the simulated engine
core does not model; the profile's `server.front_end_latency_s` (fitted by
`kvrepro.engines.sim.fit`) puts it on the simulated first-token and finish times, and so into the
closed loop of each simulated session.

`rel_error_pct` = 100 x (sim - live) / live.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvrepro.analysis.runs import prompt_split, throughput_over_time, ttft_over_time
from kvrepro.engines.sim.config import SimProfile
from kvrepro.engines.sim.engine import simulate
from kvrepro.records import Run, read_run
from kvrepro.workload import build_workload
from kvrepro.workload.base import Workload

METRICS = ("ttft_median_s", "ttft_p90_s", "total_tok_s", "cached_share")
TABLE_COLUMNS = ("run", "tier", "metric", "live", "sim", "rel_error_pct")


@dataclass
class RunComparison:
    """One live run next to its simulation: the table rows and both record sets."""

    table: pd.DataFrame
    live_records: pd.DataFrame
    sim_records: pd.DataFrame
    sim_stats: dict
    sim_wall_s: float


def run_metrics(records: pd.DataFrame, run_s: float) -> dict[str, float]:
    """The four validation metrics of one run's records (one tier), see the module doc."""
    if records["tier"].nunique() != 1:
        raise ValueError(f"run_metrics: expected one tier, got {sorted(records.tier.unique())}")
    ttft = ttft_over_time(records, bin_s=run_s, exclude_warmup=True, run_s=run_s).iloc[0]
    total = throughput_over_time(records, bin_s=run_s, run_s=run_s)["total_tok_s"].iloc[0]
    share = prompt_split(records)["hit_share"].iloc[0]
    return {"ttft_median_s": float(ttft["ttft_median_s"]),
            "ttft_p90_s": float(ttft["ttft_p90_s"]), "total_tok_s": float(total),
            "cached_share": float(share)}


def relative_error_pct(live: float, sim: float) -> float:
    """100 x (sim - live) / live; NaN when live is 0 or either value is missing."""
    if not np.isfinite(live) or not np.isfinite(sim) or live == 0:
        return float("nan")
    return 100.0 * (sim - live) / live


def compare_metrics(live: Mapping[str, float], sim: Mapping[str, float], run: str,
                    tier: str) -> pd.DataFrame:
    """Tidy rows (run, tier, metric, live, sim, rel_error_pct) for every metric in METRICS."""
    rows = [{"run": run, "tier": tier, "metric": m, "live": live[m], "sim": sim[m],
             "rel_error_pct": relative_error_pct(live[m], sim[m])} for m in METRICS]
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


def profile_for_run(profile: SimProfile, meta: Mapping) -> SimProfile:
    """A copy of `profile` serving the live run's tier: its KV budget and scheduler limits
    (exact, from `meta["tier_config"]`) and one offload-free tier named like the live one.

    The live tiers here are baselines that differ only in their server's KV budget, which
    in the simulator is a server field, not a tier field.
    """
    config, tier = meta["tier_config"], meta["tier"]
    updates = {"gpu_kv_bytes": float(config["kv_cache_memory_bytes"]),
               "max_batched_tokens": int(config["max_num_batched_tokens"]),
               "max_model_len": int(config["max_model_len"])}
    if config.get("max_num_seqs"):
        updates["max_num_seqs"] = int(config["max_num_seqs"])
    server = profile.server.model_copy(update=updates)
    return SimProfile.model_validate({**profile.model_dump(), "server": server.model_dump(),
                                      "tiers": {tier: {}}})


def compare_run(run_dir: str | Path, profile: SimProfile,
                run_name: str | None = None) -> RunComparison:
    """Simulate one live run's workload on its tier and compare the four metrics."""
    run = read_run(run_dir)
    options = run.meta.get("options", {})
    run_s = float(options.get("duration_s") or run.meta["workload"]["params"]["duration_s"])
    started = time.perf_counter()
    result = simulate(workload_of(run), profile_for_run(profile, run.meta), run.meta["tier"],
                      duration_s=run_s, warmup_s=float(options.get("warmup_s", 0.0)),
                      progress=False)
    wall_s = time.perf_counter() - started
    sim = result.records
    name = run_name or Path(run_dir).resolve().parent.name
    table = compare_metrics(run_metrics(run.records, run_s), run_metrics(sim, run_s), name,
                            run.meta["tier"])
    return RunComparison(table, run.records, sim, result.stats, wall_s)


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


def within(table: pd.DataFrame, tolerance_pct: float = 20.0) -> pd.Series:
    """Mask of table rows whose |rel_error_pct| is within the tolerance."""
    return table["rel_error_pct"].abs() <= tolerance_pct


__all__ = ["METRICS", "TABLE_COLUMNS", "RunComparison", "compare_metrics",
           "compare_run", "profile_for_run", "relative_error_pct", "run_metrics",
           "validation_table", "within", "workload_of"]
