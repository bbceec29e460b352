"""Study A's server as a fleet on the twin: routing x pool, the capacity a shared flash pool
needs against private ones for the same hit share, and what the pool's writes cost the drives.

The runs go through `kvrepro.sweep` (Ray), one sweep point per configuration, so a notebook
only builds points (`fleet_points`) and reads the tidy table; the readings here
(`capacity_for_hit_share`, `fleet_dwpd_table`) are plain functions of that table.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvrepro.calc.economics import tier_hardware
from kvrepro.calc.endurance import SECONDS_PER_DAY, dwpd_from_write_rate
from kvrepro.fleet_spec import ROUTINGS, FleetSpec


def _pool_parameters(fleet: FleetSpec) -> dict[str, Any]:
    """The fleet's shared-pool settings as flat sweep parameters (`shared_pool.<field>`)."""
    pool = fleet.shared_pool.model_dump(exclude_none=True)
    return {f"shared_pool.{key}": value for key, value in pool.items()}


def fleet_points(fleet: FleetSpec, *, routings: Sequence[str] = ROUTINGS,
                 pools: Sequence[str] = ("private", "shared"),
                 flash_gb_per_server: Sequence[float | None] = (None,),
                 rate_per_server_per_min: float = 2.5, duration_s: float = 1800.0,
                 warmup_s: float = 180.0, seed: int = 0,
                 pause: str | None = "study_a") -> list[dict[str, Any]]:
    """Sweep points (`kvrepro.studies.whatif.default_point`) of `fleet` for every routing x pool x
    flash size per server (None: the spec's own), at `rate_per_server_per_min` sessions per
    minute per server (the fleet gets n times the single server's load, as study A's server
    x 8 at 8x the rate). The shared pool's settings come from the fleet spec."""
    base: dict[str, Any] = {
        "server": fleet.server, "tier": fleet.tier, "n_servers": fleet.n_servers,
        "seed": seed, "duration_s": duration_s, "warmup_s": warmup_s,
        "session_rate_per_min": rate_per_server_per_min * fleet.n_servers,
        **_pool_parameters(fleet)}
    if pause is not None:
        base["workload.pause"] = pause
    points = []
    for routing in routings:
        for pool in pools:
            for flash_gb in flash_gb_per_server:
                point = {**base, "routing": routing, "kv_pool": pool}
                if flash_gb is not None:
                    point["flash_gb"] = float(flash_gb)
                points.append(point)
    return points


def _interpolated_capacity(part: pd.DataFrame, share_col: str, capacity_col: str,
                           target: float) -> float:
    """Smallest capacity at which the share reaches `target`, linear between the two
    sweep points around it (NaN if no point reaches it; the smallest if all do)."""
    part = part.sort_values(capacity_col)
    caps = part[capacity_col].to_numpy(float)
    shares = part[share_col].to_numpy(float)
    above = np.flatnonzero(shares >= target)
    if len(above) == 0:
        return float("nan")
    i = int(above[0])
    if i == 0:
        return float(caps[0])
    c0, c1, s0, s1 = caps[i - 1], caps[i], shares[i - 1], shares[i]
    return float(c0 + (target - s0) / (s1 - s0) * (c1 - c0))


def capacity_for_hit_share(table: pd.DataFrame, target_share: float,
                           share_col: str = "cached_share",
                           capacity_col: str = "flash_capacity_bytes",
                           by: Sequence[str] = ("routing", "kv_pool")) -> pd.DataFrame:
    """Per group (e.g. routing x pool): the total store capacity the fleet needs for its
    hit share `share_col` to reach `target_share`, interpolated between sweep points of
    different sizes. Why: "how much flash does a shared pool save" is a comparison at equal
    hit share, not at equal capacity. Columns: `by`, capacity_bytes, reached (bool)."""
    if not 0 < target_share <= 1:
        raise ValueError(f"parameter 'target_share' must be in (0, 1], got {target_share}")
    missing = [c for c in (share_col, capacity_col, *by) if c not in table]
    if missing:
        raise ValueError(f"capacity_for_hit_share: table lacks column(s) {missing}")
    rows = []
    for key, part in table.groupby(list(by), sort=True):
        keys = key if isinstance(key, tuple) else (key,)
        cap = _interpolated_capacity(part, share_col, capacity_col, target_share)
        rows.append({**dict(zip(by, keys, strict=True)), "capacity_bytes": cap,
                     "reached": bool(np.isfinite(cap))})
    return pd.DataFrame(rows)


def flash_array(fleet: FleetSpec) -> tuple[int, float]:
    """(drives, bytes per drive) of one server's flash array, from the tier spec (its
    stores' bills, `kvrepro.calc.economics.tier_hardware`)."""
    array = tier_hardware(fleet.server_spec().tier(fleet.tier))
    if not array.drives:
        raise ValueError(f"tier {fleet.tier!r} of {fleet.server!r} states no flash array "
                         "(stores[].drives, drive_tb)")
    return int(array.drives), float(array.drive_tb) * 1e12


def fleet_dwpd_table(table: pd.DataFrame, drives_per_server: int,
                     drive_capacity_bytes: float,
                     raid_levels: Sequence[str] = ("RAID0", "RAID10", "RAID5", "RAID6"),
                     write_col: str = "flash_bytes_written_per_day") -> pd.DataFrame:
    """Drive writes per day of each configuration's flash writes, per RAID layout, over the
    fleet's drives (n_servers x `drives_per_server`: a shared pool is built from the same
    drives the private tiers would have). One row per input row x layout, with the input's
    `n_servers`, `routing`, `kv_pool`, `flash_gb` (if present) and `dwpd`
    (`kvrepro.plots.fleet_figures.fleet_dwpd` draws it)."""
    keep = [c for c in ("n_servers", "routing", "kv_pool", "flash_gb", write_col) if c in table]
    rows = []
    for row in table[keep].itertuples(index=False):
        values = row._asdict()
        drives = int(values["n_servers"]) * drives_per_server
        rate_bytes_s = float(values[write_col]) / SECONDS_PER_DAY
        for level in raid_levels:
            rows.append({**values, "raid_level": level, "n_drives": drives,
                         "dwpd": dwpd_from_write_rate(rate_bytes_s, drives,
                                                      drive_capacity_bytes, level)})
    return pd.DataFrame(rows)


FLEET_METRICS = ("throughput_tok_s", "ttft_median_s", "ttft_p90_s", "cached_share",
                 "cross_instance_hit_share")
"""What the twin of a live two-instance fleet is checked on, per instance and in total."""


def _simulate_live_fleet(run_dir: str | Path, progress: bool = False) -> tuple[Any, FleetSpec]:
    """The twin's result on a live fleet run's fleet spec and regenerated workload."""
    from kvrepro.calibration.validate import run_seconds, workload_of
    from kvrepro.engines.sim.fleet import simulate_fleet
    from kvrepro.records import read_run

    run = read_run(run_dir)
    fleet = FleetSpec.model_validate(run.meta["fleet"])
    warmup_s = float(run.meta.get("options", {}).get("warmup_s") or 0.0)
    return simulate_fleet(workload_of(run), fleet, duration_s=run_seconds(run),
                          warmup_s=warmup_s, progress=progress), fleet


def twin_of_live_fleet(run_dir: str | Path, progress: bool = False) -> pd.DataFrame:
    """The twin on a live fleet run's fleet spec and regenerated workload, its records
    labelled like the live ones (kv_pool, tier, routing, router="twin") so that both go
    through the same summary (`kvrepro.analysis.fleet_live.fleet_live_summary`)."""
    result, fleet = _simulate_live_fleet(run_dir, progress)
    return result.records.assign(kv_pool=fleet.kv_pool, tier=fleet.tier,
                                 routing=fleet.routing, router="twin")


def fleet_host_cpu(run_dir: str | Path) -> pd.DataFrame:
    """Per role, all instances together: the CPUs a live fleet run's processes kept busy
    (their accounting, `fleet_live.fleet_process_cpu`; for the engine core and the worker
    this includes vLLM's queue polling) beside what the twin's host model spends for them on
    the same run (CPU-s per s; the worker's forward passes also on their own). Why: where
    the fleet twin's latency misses, which processes it has doing less than live."""
    from kvrepro.analysis.fleet_live import fleet_process_cpu

    live = fleet_process_cpu(run_dir).groupby("role")["cpu_busy"].sum()
    result, _ = _simulate_live_fleet(run_dir)
    window_s = result.stats["host_cpu_window_s"]
    twin = {role: cpu_s / window_s for role, cpu_s in result.stats["host_cpu_s"].items()}
    roles = [r for r in dict.fromkeys([*live.index, *twin]) if r != "other"]
    return pd.DataFrame({"live_cpu_busy": live.reindex(roles),
                         "twin_cpu_busy": pd.Series(twin).reindex(roles)}).rename_axis("role")


def session_waits(recordings: dict[str, str | Path]) -> pd.DataFrame:
    """One row per named live fleet run: each role's wait for a CPU per timeslice in ms (its
    main thread runnable while another task had the CPU; the instances' mean), the share of
    answers that reached the client in one burst (`analysis.runs.token_delivery`) and the
    measured turns' TTFT median and p90. Why: the same run recorded with the servers in
    sessions of their own and in the caller's shows what the kernel's autogroups cost
    (`engines.live.processes.ManagedProcess`)."""
    from kvrepro.analysis.fleet_live import fleet_live_summary, fleet_process_cpu
    from kvrepro.analysis.runs import token_delivery
    from kvrepro.records import read_run

    rows = {}
    for name, path in recordings.items():
        waits = fleet_process_cpu(path).groupby("role")["wait_per_slice_s"].mean()
        summary = fleet_live_summary(path).set_index("instance").loc["total"]
        rows[name] = {**{f"{role}_wait_per_slice_ms": 1e3 * waits[role] for role in
                         ("api_server", "engine_core", "worker", "lmcache_server", "client")
                         if role in waits},
                      "burst_share": token_delivery(read_run(path).records)["burst_share"],
                      "ttft_median_s": summary["ttft_median_s"],
                      "ttft_p90_s": summary["ttft_p90_s"]}
    return pd.DataFrame(rows).T.rename_axis("recording")


def compare_fleet_summaries(live: pd.DataFrame, sim: pd.DataFrame,
                            metrics: Sequence[str] = FLEET_METRICS) -> pd.DataFrame:
    """Tidy rows (run, tier, metric, live, sim, error, error_unit) of two
    `fleet_live_summary` tables (shares in percentage points, the rest in percent, as
    `validate.metric_error` scores them), matched on (kv_pool, tier, routing, instance);
    `run` names the configuration and `tier` the instance ("instance 0", ..., "total"), the
    layout of `validate.validation_table` and its figures."""
    from kvrepro.calibration.validate import error_unit, metric_error

    keys = ["kv_pool", "tier", "routing", "instance"]
    both = live.merge(sim, on=keys, suffixes=("_live", "_sim"), validate="one_to_one")
    rows = []
    for row in both.to_dict("records"):
        run = f"{row['kv_pool']} {row['tier']}, {row['routing'].replace('_', ' ')}"
        where = "total" if row["instance"] == "total" else f"instance {row['instance']}"
        for metric in metrics:
            lv, sv = float(row[f"{metric}_live"]), float(row[f"{metric}_sim"])
            rows.append({"run": run, "tier": where, "metric": metric, "live": lv, "sim": sv,
                         "error": metric_error(metric, lv, sv), "error_unit": error_unit(metric)})
    return pd.DataFrame(rows, columns=["run", "tier", "metric", "live", "sim", "error",
                                       "error_unit"])


def fleet_validation(live_dir: str | Path, progress: bool = False) -> pd.DataFrame:
    """The twin's prediction of every live fleet run under `live_dir` (one run folder or a
    campaign of them), metric by metric with signed errors (`compare_fleet_summaries`)."""
    from kvrepro.analysis.fleet_live import fleet_live_summary, load_fleet_runs

    root = Path(live_dir)
    records, samples = load_fleet_runs(root)
    dirs = [root] if (root / "records.jsonl").is_file() else sorted(
        p for p in root.iterdir() if (p / "records.jsonl").is_file())
    twin = pd.concat([twin_of_live_fleet(d, progress) for d in dirs], ignore_index=True)
    live = fleet_live_summary(records, samples)
    sim = fleet_live_summary(twin)
    return compare_fleet_summaries(live.drop(columns="router"), sim.drop(columns="router"))


def preregistered_fleet_score(live_dir: str | Path) -> pd.DataFrame:
    """The committed predictions of `live_dir/predictions.csv` against the recorded runs
    there (`compare_fleet_summaries`'s rows): unlike `fleet_validation`, what the twin said
    before the recording, not what today's twin says of it."""
    from kvrepro.analysis.fleet_live import fleet_live_summary
    from kvrepro.calibration.preregister import PREDICTIONS

    path = Path(live_dir) / PREDICTIONS
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no committed predictions for this fleet campaign")
    predicted = pd.read_csv(path, dtype={"instance": str})
    live = fleet_live_summary(live_dir).drop(columns="router")
    return compare_fleet_summaries(live.assign(instance=live["instance"].astype(str)),
                                   predicted)


def replicate_fleet_score(earlier: str | Path, later: str | Path) -> pd.DataFrame:
    """The live fleet scored as the twin is: one fleet run recorded twice with the same
    command, the earlier recording's summary taken as the prediction of the later one's
    (`compare_fleet_summaries`; `ttft_score` reads it against the goal). Why: what a twin
    that reproduced one recording exactly would score on the next. Refused (ValueError
    naming both folders) unless the two ran the same workload and fleet."""
    from kvrepro.analysis.fleet_live import fleet_live_summary
    from kvrepro.records import read_run

    metas = [read_run(path).meta for path in (earlier, later)]
    same = ("workload_digest", "fleet", "kv_pool", "routing", "tier", "options")
    if any(metas[0].get(key) != metas[1].get(key) for key in same):
        raise ValueError(f"{earlier} and {later}: not the same command (they differ in "
                         f"{[k for k in same if metas[0].get(k) != metas[1].get(k)]})")
    first, again = (fleet_live_summary(path).drop(columns="router") for path in (earlier, later))
    return compare_fleet_summaries(again, first)


FLEET_TTFT_GOAL_PCT = 25.0
"""Issue [host-cpu]'s goal for the live fleet: TTFT median and p90 within 25 % of the live
value on every pre-registered run, each instance and the total."""


def plan_scores(plan_path: str | Path) -> dict[str, pd.DataFrame]:
    """The committed predictions' score (`preregistered_fleet_score`) of every campaign of a
    pre-registered fleet plan (`kvrepro.studies.fleet_prereg`) with recorded runs."""
    from kvrepro.studies.fleet_prereg import load_plan

    root = Path(plan_path).parent
    return {campaign: preregistered_fleet_score(root / campaign)
            for campaign in load_plan(plan_path).campaigns
            if any((root / campaign).glob("*/meta.json"))}


def ttft_score(score: pd.DataFrame, goal_pct: float = FLEET_TTFT_GOAL_PCT) -> dict[str, float]:
    """Of a fleet score's TTFT rows (median and p90 of each instance and the total): how
    many are within `goal_pct`, of how many, and their median |error| in %."""
    errors = score.loc[score.metric.isin(["ttft_median_s", "ttft_p90_s"]), "error"].abs()
    return {"within": int((errors <= goal_pct).sum()), "n": int(len(errors)),
            "median_abs_error_pct": float(errors.median())}


def instance_turns(campaign_dir: str | Path) -> pd.DataFrame:
    """Per recorded run of a pre-registered fleet campaign and instance: the measured turns
    live and in the committed predictions. Why: an instance's TTFT follows its load, and a
    router that sends the twin's sessions elsewhere than vllm-router does moves load
    between instances that no step model can give back (session affinity until the twin
    followed vllm-router's ring, `engines.sim.consistent_hash`; the prefix-aware router's
    choices, which follow the load)."""
    from kvrepro.analysis.fleet_live import fleet_live_summary
    from kvrepro.calibration.preregister import PREDICTIONS

    root = Path(campaign_dir)
    predicted = pd.read_csv(root / PREDICTIONS, dtype={"instance": str})
    live = fleet_live_summary(root).drop(columns="router")
    keys = ["kv_pool", "tier", "routing", "instance"]
    both = live[keys + ["n_turns"]].merge(predicted[keys + ["n_turns"]], on=keys,
                                          suffixes=("_live", "_predicted"))
    return both[both.instance != "total"].reset_index(drop=True)
