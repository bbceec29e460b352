"""Pre-registered live fleet runs: the twin's predictions are committed before the recording.

Why: the twin's fleet model (two instances, router, LMCache and client on two shared CPUs:
`engines.sim.host_cpu`) is judged on runs it was not fitted to, and only if nothing about it
was chosen with them in view. The protocol (notebook 13, a plan.yaml next to the runs):

1. freeze the twin (the spec `data/servers/cpu_tiny.yaml` and the code);
2. `python -m kvrepro.studies.fleet_prereg predict PLAN`: for every run of the plan the twin
   runs the planned fleet and workload and writes the campaign's predictions.csv (rows of
   `analysis.fleet_live.fleet_live_summary`); commit it;
3. run the plan's run.sh (`kvrepro run fleet`, one folder per configuration);
4. `... check PLAN`: every run started after its predictions were committed, and how far
   the twin today is from the committed numbers (0 while frozen);
   `fleet_study.preregistered_fleet_score` scores the committed numbers.
"""

from __future__ import annotations

import argparse
import gzip
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from kvrepro._checks import load_yaml, validate_model
from kvrepro.analysis.fleet_live import fleet_live_summary
from kvrepro.engines.sim.fleet import simulate_fleet
from kvrepro.fleet_spec import FleetSpec, shipped_fleet
from kvrepro.records import read_run
from kvrepro.workload import build_workload

PREDICTIONS = "predictions.csv"


class PlannedRun(BaseModel):
    """One live fleet run: its pool, routing and tier, and its workload's own parameters."""

    model_config = ConfigDict(extra="forbid")
    kv_pool: str
    routing: str
    tier: str = "dram"
    workload: dict[str, Any] = Field(default_factory=dict, description="over the common ones")


class FleetPlan(BaseModel):
    """plan.yaml: the fleet, the common workload, the window, and the runs by campaign
    folder (each folder gets its predictions.csv and its runs)."""

    model_config = ConfigDict(extra="forbid")
    fleet: str = Field(description="shipped fleet name (data/fleets)")
    duration_s: float = Field(gt=0)
    warmup_s: float = Field(ge=0)
    workload: dict[str, Any] = Field(description="agentic workload parameters, every run")
    campaigns: dict[str, list[PlannedRun]] = Field(description="folder -> its runs")


def load_plan(path: str | Path) -> FleetPlan:
    """Read a plan.yaml; an error names the file and the key."""
    path = Path(path)
    return validate_model(load_yaml(path.read_text(), str(path)), FleetPlan, "fleet plan",
                          str(path))


def planned_fleet(plan: FleetPlan, run: PlannedRun) -> FleetSpec:
    """The plan's fleet with the run's pool, routing and tier."""
    return shipped_fleet(plan.fleet).model_copy(update={
        "kv_pool": run.kv_pool, "routing": run.routing, "tier": run.tier})


def predict_run(plan: FleetPlan, run: PlannedRun) -> pd.DataFrame:
    """The twin's `fleet_live_summary` rows of one planned run (per instance and total)."""
    params = {**plan.workload, **run.workload, "duration_s": plan.duration_s,
              "warmup_s": plan.warmup_s}
    fleet = planned_fleet(plan, run)
    result = simulate_fleet(build_workload("agentic", params), fleet,
                            duration_s=plan.duration_s, warmup_s=plan.warmup_s)
    records = result.records.assign(kv_pool=fleet.kv_pool, tier=fleet.tier,
                                    routing=fleet.routing, router="twin")
    return fleet_live_summary(records).drop(columns="router")


def write_predictions(plan_path: str | Path) -> list[Path]:
    """Every campaign's predictions.csv next to the plan; a campaign with a recorded run is
    refused (its predictions would no longer come first)."""
    root, plan = Path(plan_path).parent, load_plan(plan_path)
    written = []
    for folder, runs in plan.campaigns.items():
        out = root / folder
        recorded = sorted(p.parent.name for p in out.glob("*/meta.json"))
        if recorded:
            raise ValueError(f"{out}: runs {recorded} are recorded already; predictions must "
                             "come first")
        out.mkdir(parents=True, exist_ok=True)
        table = pd.concat([predict_run(plan, r) for r in runs], ignore_index=True)
        table.to_csv(out / PREDICTIONS, index=False, float_format="%.6g")
        written.append(out / PREDICTIONS)
    return written


def _committed(path: Path) -> datetime | None:
    out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%cI", "--", path.name],
                         cwd=path.parent, capture_output=True, text=True, check=False)
    lines = out.stdout.split()
    return datetime.fromisoformat(lines[-1]) if out.returncode == 0 and lines else None


VLLM_LOG_TIME = re.compile(r" INFO (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")
"""The time of a vLLM log line ("INFO 12-05 00:31:56 [...]": month, day, UTC here)."""


def run_start(run_dir: Path, year: int) -> datetime | None:
    """When a fleet run started: meta.json's started_utc (fleet runs record it since
    issue [host-cpu]), else its first instance's first vLLM log line, in `year` (vLLM's log
    gives month and day only; UTC, as this machine's clock)."""
    started = read_run(run_dir).meta.get("started_utc")
    if started:
        return datetime.fromisoformat(started)
    log = next(iter(sorted((run_dir / "i0").glob("server.log*"))), None)
    if log is None:
        return None
    text = gzip.decompress(log.read_bytes()).decode(errors="replace") \
        if log.suffix == ".gz" else log.read_text(errors="replace")
    hit = VLLM_LOG_TIME.search(text)
    if hit is None:
        return None
    month, day, hour, minute, second = map(int, hit.groups())
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def prediction_drift(plan: FleetPlan, run: PlannedRun, committed: pd.DataFrame) -> float:
    """How far the twin today is from a run's committed prediction: the largest relative
    difference over its rows' throughput, TTFT and cached share (0 while frozen; a later
    model change shows here, not as a silent re-score)."""
    keys = ["kv_pool", "tier", "routing", "instance"]
    today = predict_run(plan, run).assign(instance=lambda t: t["instance"].astype(str))
    both = committed.merge(today, on=keys, suffixes=("", "_today"))
    drift = 0.0
    for metric in ("throughput_tok_s", "ttft_median_s", "ttft_p90_s", "cached_share"):
        scale = both[metric].abs().where(both[metric] != 0, 1.0)
        drift = max(drift, float(((both[f"{metric}_today"] - both[metric]).abs()
                                  / scale).max()))
    return drift


def protocol_table(plan_path: str | Path) -> pd.DataFrame:
    """Per planned run: when its campaign's predictions were committed, when it started
    (meta.json), whether that order holds (False while it is not recorded), and the twin's
    drift from the committed prediction today (`prediction_drift`)."""
    root, plan = Path(plan_path).parent, load_plan(plan_path)
    rows = []
    for folder, runs in plan.campaigns.items():
        committed = _committed(root / folder / PREDICTIONS)
        stored = pd.read_csv(root / folder / PREDICTIONS, dtype={"instance": str})
        for run in runs:
            run_dir = root / folder / f"{run.kv_pool}-{run.tier}-{run.routing}"
            year = committed.year if committed else datetime.now(UTC).year
            started_at = run_start(run_dir, year) if (run_dir / "meta.json").exists() \
                else None
            rows.append({"campaign": folder, "run": run_dir.name, "predicted_utc": committed,
                         "recorded_utc": started_at,
                         "predicted_first": bool(committed and started_at
                                                 and committed < started_at),
                         "max_prediction_drift": prediction_drift(plan, run, stored[
                             (stored.kv_pool == run.kv_pool) & (stored.tier == run.tier)
                             & (stored.routing == run.routing)])})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    """`python -m kvrepro.studies.fleet_prereg predict|check PLAN`."""
    parser = argparse.ArgumentParser(prog="python -m kvrepro.studies.fleet_prereg")
    parser.add_argument("action", choices=["predict", "check"])
    parser.add_argument("plan", help="the campaign's plan.yaml")
    args = parser.parse_args(argv)
    try:
        if args.action == "predict":
            for path in write_predictions(args.plan):
                print(f"wrote {path}")
            return 0
        table = protocol_table(args.plan)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(table.to_string(index=False))
    return 0 if table["predicted_first"].all() else 1


__all__ = ["FleetPlan", "PlannedRun", "load_plan", "planned_fleet", "predict_run",
           "prediction_drift", "protocol_table", "run_start", "write_predictions"]


if __name__ == "__main__":
    sys.exit(main())
