"""The host-CPU guard: the twin must reproduce what its measured host constants were measured
on (issue [host-cpu]; tests/calibration/test_host_guard.py).

Rows, each live against the twin, |error| in % of the live value:

* per fit-run tier, the API server's, LMCache server's and client's CPUs busy (their process
  accounting, `analysis.runs.process_cpu`, against the CPU the twin's host model spends for
  them on the replayed run): what the regressed demand must give back;
* per profiled tier, the engine core's and the worker's CPU of work besides the forward pass
  (sampled stacks, `fit_host.stack_table`, against the twin's share of its step host part):
  what the split must give back;
* the handoff wait the spec states against the benchmark's measurement (`handoff.json`).

The split is one number per role for every tier (CPU seconds per second of host part,
pooled over the profiled tiers), so what it must give back is the pooled row (tier
`POOLED`); the per-tier rows show how far one split is from each tier.

Every measured constant is a row's input, so moving it shows as a miss in a row of its own
role unless its share of that row is below the tolerance, or the row is a known miss
(data/live/cpu_tiny_host_guard.yaml lists both, with why; `caught` judges a move).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

from kvrepro._paths import data_file
from kvrepro.analysis.runs import process_cpu
from kvrepro.calibration.fit_host import HANDOFF_JSON, PROFILE_DIR, stack_table
from kvrepro.calibration.validate import FIT_RUN, LIVE_TIERS, relative_error_pct, simulate_run
from kvrepro.engines.sim.config import SimProfile
from kvrepro.engines.sim.host_cpu import MEASURED_ROLES
from kvrepro.records import read_run

SPLIT_ROLES = ("engine_core", "worker")
POOLED = "pooled"
"""The tier label of the split's rows summed over the profiled tiers."""
TOLERANCES = ("live", "cpu_tiny_host_guard.yaml")
"""Under the package's data: the guard's tolerances, known misses and known escapes."""


def _twin_busy(run_dir: Path, profile: SimProfile) -> dict[str, float]:
    """The twin's CPUs busy per role on a replayed run (CPU-s per s of its host window)."""
    result, _, _ = simulate_run(read_run(run_dir), profile)
    window_s = result.stats["host_cpu_window_s"]
    return {role: cpu_s / window_s for role, cpu_s in result.stats["host_cpu_s"].items()}


def _accounted_rows(profile: SimProfile, fit_dir: Path, tiers: tuple[str, ...]) -> list[dict]:
    rows = []
    for tier in tiers:
        live = process_cpu(read_run(fit_dir / tier).samples).set_index("role")["cpu_busy"]
        twin = _twin_busy(fit_dir / tier, profile)
        rows += [{"source": "accounting", "tier": tier, "role": role,
                  "live": float(live[role]), "sim": twin.get(role, 0.0)}
                 for role in MEASURED_ROLES if role in live.index]
    return rows


def _stack_rows(profile: SimProfile, profile_dir: Path) -> list[dict]:
    stacks = stack_table(profile_dir).set_index(["tier", "role"])
    rows = []
    for tier in stacks.index.get_level_values("tier").unique():
        twin = _twin_busy(profile_dir / tier, profile)
        for role in SPLIT_ROLES:
            row = stacks.loc[(tier, role)]
            work = row["work_s"] - (row["forward_s"] if role == "worker" else 0.0)
            forward = twin.get("worker_forward", 0.0)  # not the host part's split
            sim = twin.get(role, 0.0) - (forward if role == "worker" else 0.0)
            rows.append({"source": "stacks", "tier": tier, "role": role, "live": float(work),
                         "sim": sim})
    pooled = pd.DataFrame(rows).groupby("role", sort=False)[["live", "sim"]].sum()
    return rows + [{"source": "stacks", "tier": POOLED, "role": role, "live": float(r.live),
                    "sim": float(r.sim)} for role, r in pooled.iterrows()]


def handoff_row(profile: SimProfile, profile_dir: str | Path | None = None) -> dict:
    """The handoff wait the spec states against the benchmark's measurement."""
    stacks = Path(profile_dir) if profile_dir is not None else data_file("live", PROFILE_DIR)
    handoff = json.loads((stacks / HANDOFF_JSON).read_text())["handoff_wait_s"]
    return {"source": "benchmark", "tier": "", "role": "handoff_wait_s", "live": handoff,
            "sim": profile.host_cpu.handoff_wait_s if profile.host_cpu else 0.0}


def host_guard_table(profile: SimProfile, fit_dir: str | Path | None = None,
                     profile_dir: str | Path | None = None,
                     tiers: tuple[str, ...] = LIVE_TIERS, stacks: bool = True) -> pd.DataFrame:
    """The guard's rows (source, tier, role, live, sim, error_pct); see the module doc.
    `tiers`: the fit run's tiers to replay; `stacks`: with the profile runs' rows."""
    fit = Path(fit_dir) if fit_dir is not None else data_file("live", FIT_RUN)
    stack_dir = Path(profile_dir) if profile_dir is not None else data_file("live", PROFILE_DIR)
    rows = [*_accounted_rows(profile, fit, tiers),
            *(_stack_rows(profile, stack_dir) if stacks else []),
            handoff_row(profile, stack_dir)]
    table = pd.DataFrame(rows)
    table["error_pct"] = [relative_error_pct(a, b) for a, b in
                          zip(table["live"], table["sim"], strict=True)]
    return table


def scaled_host(profile: SimProfile, constant: str, factor: float, folder: Path) -> SimProfile:
    """`profile` with one measured host constant times `factor`: `handoff_wait_s`, or a
    demand row `role.unit` (written to a copy of the demand table in `folder`)."""
    host = profile.host_cpu
    if constant == "handoff_wait_s":
        moved = host.model_copy(update={"handoff_wait_s": host.handoff_wait_s * factor})
    else:
        role, unit = constant.split(".")
        table = pd.read_csv(host.demand_csv)
        hit = (table["role"] == role) & (table["unit"] == unit)
        if not hit.any():
            raise ValueError(f"{host.demand_csv}: no demand row {constant!r}")
        table.loc[hit, "cpu_s_per_unit"] *= factor
        path = Path(folder) / f"demand-{role}-{unit}-x{factor:g}.csv"
        table.to_csv(path, index=False)
        moved = host.model_copy(update={"demand_csv": str(path)})
    return profile.model_copy(update={"host_cpu": moved})


def load_tolerances(path: str | Path | None = None) -> dict:
    """The guard's tolerance file (`TOLERANCES` by default): `max_abs_error_pct` by source,
    `known_misses` (source, tier, role, why) and `known_escapes` (constant, factor, why)."""
    return yaml.safe_load(Path(path or data_file(*TOLERANCES)).read_text())


def guard_misses(table: pd.DataFrame, tolerances: dict,
                 roles: tuple[str, ...] | None = None) -> list[str]:
    """Rows beyond their source's tolerance, as readable lines; the known misses are left
    out (they are tested on their own); with `roles`, only those roles' rows."""
    known = {(m["source"], m["tier"], m["role"]) for m in tolerances.get("known_misses") or []}
    limits = tolerances["max_abs_error_pct"]
    return [f"{r.source} {r.tier} {r.role}: live {r.live:.4g}, twin {r.sim:.4g}, "
            f"{r.error_pct:+.1f} % (tolerance {limits[r.source]} %)"
            for r in table.itertuples()
            if abs(r.error_pct) > limits[r.source] and (r.source, r.tier, r.role) not in known
            and (roles is None or r.role in roles)]


def caught(profile: SimProfile, constant: str, factor: float, folder: Path,
           tolerances: dict) -> list[str]:
    """The misses a move of one measured constant by `factor` makes in its own role's rows
    (empty: the guard does not catch it). Only the rows it is an input to are replayed."""
    role = constant.split(".")[0]  # the handoff wait's row is named after it
    moved = scaled_host(profile, constant, factor, folder)
    table = host_guard_table(moved, tiers=() if role not in MEASURED_ROLES else LIVE_TIERS,
                             stacks=role in SPLIT_ROLES)
    return guard_misses(table, tolerances, roles=(role,))


def measured_constants(profile: SimProfile) -> list[str]:
    """The host constants the guard must catch when moved: every demand row the twin reads
    (`role.unit`) and the handoff wait."""
    table = pd.read_csv(profile.host_cpu.demand_csv)
    return [f"{r}.{u}" for r, u in zip(table["role"], table["unit"], strict=True)] + [
        "handoff_wait_s"]


__all__ = ["POOLED", "SPLIT_ROLES", "TOLERANCES", "caught", "guard_misses", "handoff_row",
           "host_guard_table", "load_tolerances", "measured_constants", "scaled_host"]
