"""Several tiers on one workload, and profile overrides for what-if questions.

`simulate_campaign` is the simulated twin of `kvrepro.engines.live.runner.run_campaign`: the same
workload on each tier, one run folder per tier (optional), and the records and samples of all
tiers concatenated for `kvrepro.analysis.runs`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from kvrepro.engines.sim.config import SimProfile, load_profile
from kvrepro.engines.sim.engine import simulate
from kvrepro.workload.base import Workload

CAPACITY_ALIASES = {"dram_gb": "dram", "flash_gb": "flash", "staging_gb": "staging"}


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node: Any = tree
    keys = dotted.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def override_profile(profile: SimProfile, overrides: dict[str, Any]) -> SimProfile:
    """A copy of `profile` with overrides applied and validated again.

    Keys are dotted paths (`server.mfu`, `tiers.dram.offload.0.read_bw_bytes_s`) or the
    aliases `dram_gb`, `flash_gb`, `staging_gb`, which set the capacity (in GB) of every
    offload store of that name. An unknown key is an error naming it.
    """
    tree = profile.model_dump()
    for key, value in overrides.items():
        if key in CAPACITY_ALIASES:
            stores = [s for t in tree["tiers"].values() for s in t["offload"]
                      if s["name"] == CAPACITY_ALIASES[key]]
            if not stores:
                raise ValueError(f"profile override {key!r}: no offload store named "
                                 f"{CAPACITY_ALIASES[key]!r} in this profile")
            for store in stores:
                store["capacity_bytes"] = float(value) * 1e9
            continue
        try:
            _set_path(tree, key, value)
        except (KeyError, IndexError, ValueError, TypeError) as err:
            raise ValueError(f"profile override {key!r}: no such field ({err})") from err
    return SimProfile.model_validate(tree)


def simulate_campaign(workload: Workload, profile: SimProfile | str | Path,
                      tiers: list[str] | None = None, out_dir: str | Path | None = None,
                      warmup_s: float = 0.0, duration_s: float | None = None,
                      progress: bool = True, max_in_flight: int | None = None
                      ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Simulate each tier on `workload`; return all records and samples (column `tier`).

    `max_in_flight` is the load client's concurrency limit (`kvrepro.engines.sim.simulate`)."""
    profile = load_profile(profile) if isinstance(profile, (str, Path)) else profile
    names = tiers or list(profile.tiers)
    records, samples = [], []
    for name in names:
        run_dir = Path(out_dir) / name if out_dir else None
        result = simulate(workload, profile, name, duration_s=duration_s, warmup_s=warmup_s,
                          run_dir=run_dir, progress=progress, max_in_flight=max_in_flight)
        records.append(result.records)
        samples.append(result.samples.assign(tier=name))
    return pd.concat(records, ignore_index=True), pd.concat(samples, ignore_index=True)


def _summary(records: pd.DataFrame, samples: pd.DataFrame, store: str | None,
             capacity_bytes: float | None, run_s: float) -> dict[str, float]:
    from kvrepro import analysis

    binned = analysis.smooth_rates(analysis.throughput_over_time(records, 300.0, run_s), 3)
    late = binned[binned.bin_start_s >= 2 * run_s / 3].total_tok_s.mean()
    fill_s = float("nan")
    if store and capacity_bytes and f"{store}_bytes_used" in samples:
        fill_s = analysis.fill_time_s(samples, f"{store}_bytes_used", capacity_bytes)
    ok = records[records.error == ""]
    return {"peak_tok_s": float(binned.total_tok_s.max()), "late_tok_s": float(late),
            "fill_min": fill_s / 60, "ttft_median_s": float(ok.ttft_s.median()),
            "cached_share": float(ok.cached_prompt_tokens.sum() / ok.prompt_tokens.sum())}


def sweep(make_workload: Any, profile: SimProfile, tier: str,
          grid: list[dict[str, Any]], store: str | None = None,
          run_s: float = 5400.0) -> pd.DataFrame:
    """Simulate `tier` once per grid point and summarise where it saturates.

    Each grid point is a dict of profile overrides (see `override_profile`) plus optionally
    `workload` (a dict of workload parameters passed to `make_workload`). The summary gives
    peak and late (last third) total throughput, the time `store` fills, median TTFT and the
    cached share.
    """
    rows = []
    for point in grid:
        overrides = {k: v for k, v in point.items() if k != "workload"}
        prof = override_profile(profile, overrides)
        workload = make_workload(**point.get("workload", {}))
        result = simulate(workload, prof, tier, progress=False)
        capacity = sum(s.capacity_bytes for s in prof.tiers[tier].offload if s.name == store)
        rows.append({**{k: str(v) for k, v in point.items()}, "tier": tier,
                     **_summary(result.records, result.samples, store, capacity, run_s)})
    return pd.DataFrame(rows)
