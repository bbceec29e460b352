"""The simulator's `run` (the interface both engines share, `kvrepro.engines.run_result`) and
several tiers on one workload. Sweeps of what-if overrides run on Ray: `kvrepro.sweep`
(`run_sweep`; notebook 07's points: `kvrepro.studies.whatif`).

`simulate_campaign` is the simulated twin of `kvrepro.engines.live.runner.run_campaign`: the same
workload on each tier, one run folder per tier (optional), and the records and samples of all
tiers concatenated for `kvrepro.analysis.runs`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from kvrepro._paths import child_path
from kvrepro.engines.run_result import (
    DRAIN_TIMEOUT_S,
    RunResult,
    concat_results,
    store_counters_from_samples,
)
from kvrepro.engines.sim.config import SimProfile, as_profile
from kvrepro.engines.sim.engine import default_duration_s, simulate
from kvrepro.tier_spec import ServerSpec
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
    duration = duration_s if duration_s is not None else default_duration_s(workload, None)
    hard_end = None if drain_timeout_s is None else duration + drain_timeout_s
    result = simulate(workload, profile, tier, duration_s=duration_s, warmup_s=warmup_s,
                      run_dir=run_dir, hard_end_s=hard_end, max_in_flight=max_in_flight,
                      progress=progress)
    stores = [s.name for s in profile.tier(tier).stores]
    first = {s: result.stats.get(f"{s}_first_eviction_s", float("nan")) for s in stores}
    meta = {"engine": "sim", "tier": tier, "stats": result.stats}
    return RunResult(result.records, result.samples, meta,
                     store_counters_from_samples(result.samples, tier, stores, first))


def campaign(workload: Workload, server: SimProfile | ServerSpec | str | Path,
             tiers: list[str] | None = None, out_dir: str | Path | None = None,
             **options: Any) -> dict[str, RunResult]:
    """`run` on each tier (all of the server's by default), one run folder per tier.

    Every tier's folder is checked to lie inside `out_dir` before the first run (a tier
    named `../x` is a ValueError, not a run written elsewhere)."""
    profile = as_profile(server)
    names = tiers or list(profile.tiers)
    folders = {name: child_path(out_dir, name, "tier") if out_dir else None for name in names}
    return {name: run(workload, profile, name, folders[name], **options) for name in names}


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
