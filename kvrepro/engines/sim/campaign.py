"""The simulator's `run` (the interface both engines share, `kvrepro.engines.run_result`), several
tiers on one workload, and sweeps of what-if overrides of the server spec.

`simulate_campaign` is the simulated twin of `kvrepro.engines.live.runner.run_campaign`: the same
workload on each tier, one run folder per tier (optional), and the records and samples of all
tiers concatenated for `kvrepro.analysis.runs`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from kvrepro.engines.run_result import (
    DRAIN_TIMEOUT_S,
    RunResult,
    concat_results,
    store_counters_from_samples,
)
from kvrepro.engines.sim.config import SimProfile, as_profile, sim_profile
from kvrepro.engines.sim.engine import _default_duration_s, simulate
from kvrepro.tier_spec import ServerSpec, override_server
from kvrepro.workload.base import Workload


def run(workload: Workload, server: SimProfile | ServerSpec | str | Path, tier: str,
        run_dir: str | Path | None = None, *, duration_s: float | None = None,
        warmup_s: float = 0.0, max_in_flight: int | None = None,
        drain_timeout_s: float | None = DRAIN_TIMEOUT_S, progress: bool = True) -> RunResult:
    """Simulate tier `tier` of `server` on `workload` (the live engine's `run`, simulated).

    The end of the run follows `kvrepro.engines.run_result`: with `drain_timeout_s`, the clock
    stops that long after `duration_s` and requests still in the server are counted in
    `meta["stats"]["unfinished"]`, not recorded.
    """
    profile = as_profile(server)
    duration = duration_s if duration_s is not None else _default_duration_s(workload, None)
    hard_end = None if drain_timeout_s is None else duration + drain_timeout_s
    result = simulate(workload, profile, tier, duration_s=duration_s, warmup_s=warmup_s,
                      run_dir=run_dir, hard_end_s=hard_end, max_in_flight=max_in_flight,
                      progress=progress)
    stores = [s.name for s in profile.tier(tier).offload]
    first = {s: result.stats.get(f"{s}_first_eviction_s", float("nan")) for s in stores}
    meta = {"engine": "sim", "tier": tier, "stats": result.stats}
    return RunResult(result.records, result.samples, meta,
                     store_counters_from_samples(result.samples, tier, stores, first))


def campaign(workload: Workload, server: SimProfile | ServerSpec | str | Path,
             tiers: list[str] | None = None, out_dir: str | Path | None = None,
             **options: Any) -> dict[str, RunResult]:
    """`run` on each tier (all of the server's by default), one run folder per tier."""
    profile = as_profile(server)
    return {name: run(workload, profile, name, Path(out_dir) / name if out_dir else None,
                      **options)
            for name in (tiers or list(profile.tiers))}


def simulate_campaign(workload: Workload, profile: SimProfile | ServerSpec | str | Path,
                      tiers: list[str] | None = None, out_dir: str | Path | None = None,
                      warmup_s: float = 0.0, duration_s: float | None = None,
                      progress: bool = True, max_in_flight: int | None = None
                      ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`campaign`, concatenated: all tiers' records and samples (column `tier`), as
    `kvrepro.analysis` takes them."""
    return concat_results(campaign(workload, profile, tiers, out_dir, warmup_s=warmup_s,
                                   duration_s=duration_s, progress=progress,
                                   max_in_flight=max_in_flight))


def _summary(records: pd.DataFrame, samples: pd.DataFrame, store: str | None,
             capacity_bytes: float | None, run_s: float) -> dict[str, float]:
    from kvrepro import analysis

    binned = analysis.smooth_rates(analysis.throughput_over_time(records, 300.0, run_s), 3)
    late = analysis.late_bins(binned, run_s).total_tok_s.mean()
    fill_s = float("nan")
    if store and capacity_bytes and f"{store}_bytes_used" in samples:
        fill_s = analysis.fill_time_s(samples, f"{store}_bytes_used", capacity_bytes)
    ok = records[records.error == ""]
    return {"peak_tok_s": float(binned.total_tok_s.max()), "late_tok_s": float(late),
            "fill_min": fill_s / 60, "ttft_median_s": float(ok.ttft_s.median()),
            "cached_share": float(ok.cached_prompt_tokens.sum() / ok.prompt_tokens.sum())}


def sweep(make_workload: Any, spec: ServerSpec, tier: str,
          grid: list[dict[str, Any]], store: str | None = None,
          run_s: float = 5400.0) -> pd.DataFrame:
    """Simulate `tier` once per grid point and summarise where it saturates.

    Each grid point is a dict of server overrides (`kvrepro.tier_spec.override_server`) plus
    optionally
    `workload` (a dict of workload parameters passed to `make_workload`). The summary gives
    peak and late (last third) total throughput, the time `store` fills, median TTFT and the
    cached share.
    """
    rows = []
    for point in grid:
        overrides = {k: v for k, v in point.items() if k != "workload"}
        prof = sim_profile(override_server(spec, overrides))
        workload = make_workload(**point.get("workload", {}))
        result = simulate(workload, prof, tier, progress=False)
        capacity = sum(s.capacity_bytes for s in prof.tiers[tier].offload if s.name == store)
        rows.append({**{k: str(v) for k, v in point.items()}, "tier": tier,
                     **_summary(result.records, result.samples, store, capacity, run_s)})
    return pd.DataFrame(rows)
