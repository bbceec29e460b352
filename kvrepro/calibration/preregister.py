"""Pre-registered held-out runs: the twin's predictions are committed before the live runs.

Why: a held-out run only tests the twin if nothing about the twin was chosen with it in
view. The protocol (notebook 06, `data/live/cpu_tiny_prereg/plan.yaml`):

1. fit the tiny server on its fit campaign (`python -m kvrepro.calibration`), freeze the spec
   and the twin;
2. `python -m kvrepro.calibration.preregister predict`: for every set of the plan, the twin
   runs the set's workload on each tier exactly as the live engine will deploy it (the same
   rendered tier config, `live_tier`) and writes `<set>/predictions.csv`; commit those files;
3. `... record SET`: run the set for real (`run_campaign`, one folder per tier);
4. `... check`: every set's predictions commit is older than its runs' start
   (`started_utc` of meta.json, the first line of server.log), and the twin still predicts
   the committed numbers (a later model change shows as a stale prediction, not as a silent
   re-score).

The live side of the score is `kvrepro.calibration.validate` on the recorded folders.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from kvrepro._checks import load_yaml, validate_model
from kvrepro._paths import data_file, safe_name
from kvrepro.calibration import validate
from kvrepro.engines.live.tiers import live_tier
from kvrepro.engines.sim.config import SimProfile, sim_profile
from kvrepro.records import read_run
from kvrepro.tier_spec import ServerSpec, load_server, override_server
from kvrepro.workload import build_workload
from kvrepro.workload.base import Workload

PREREG_ROOT = validate.HELD_OUT_ROOT
"""data/live/<PREREG_ROOT>: the plan, and one folder per set (predictions.csv, tier runs);
named once, in `validate.HELD_OUT_ROOT`, whose `held_out_sets()` are this plan's sets."""
PREDICTIONS = "predictions.csv"


class HeldOutSet(BaseModel):
    """One held-out campaign: its workload parameters and server overrides on the plan's."""

    model_config = ConfigDict(extra="forbid")
    workload: dict[str, Any] = Field(default_factory=dict)
    server: dict[str, Any] = Field(default_factory=dict, description="dotted -p overrides")


class Plan(BaseModel):
    """The pre-registered campaigns (plan.yaml)."""

    model_config = ConfigDict(extra="forbid")
    server: str = Field(description="server spec file, relative to the project root")
    fitted_on: str | None = Field(None, description=(
        "the fit campaign (relative to the project root) that `python -m "
        "kvrepro.calibration` wrote `server` from; None: the package's spec and its fit run"))
    fit_options: list[str] = Field(default_factory=list, description=(
        "the options `python -m kvrepro.calibration` wrote `server` with (e.g. "
        "--attention-rate), before the campaign and the spec's path"))
    tiers: list[str] = Field(min_length=1)
    duration_s: float = Field(gt=0)
    warmup_s: float = Field(ge=0)
    workload: str = "agentic"
    common: dict[str, Any] = Field(default_factory=dict)
    sets: dict[str, HeldOutSet] = Field(min_length=1)

    def held_out(self, name: str) -> HeldOutSet:
        """The set called `name`; the error lists the known ones."""
        if name not in self.sets:
            raise ValueError(f"unknown held-out set {name!r}; known: {sorted(self.sets)}")
        return self.sets[name]


def plan_path(root: str | Path | None = None) -> Path:
    """The plan file (default: the package's data/live/cpu_tiny_prereg/plan.yaml)."""
    return Path(root or data_file("live", PREREG_ROOT)) / "plan.yaml"


def load_plan(path: str | Path | None = None) -> Plan:
    """Read and check a plan; errors name the file and the key."""
    path = Path(path) if path is not None else plan_path()
    return validate_model(load_yaml(path.read_text(), str(path)), Plan, "held-out plan",
                          str(path))


def plan_server(plan: Plan, project_root: Path | None = None) -> ServerSpec:
    """The plan's server spec (its `server`, relative to the project root)."""
    return load_server((project_root or data_file().parent) / plan.server)


def set_server(plan: Plan, name: str, project_root: Path | None = None) -> ServerSpec:
    """The server spec a set runs: the plan's, with the set's overrides."""
    return override_server(plan_server(plan, project_root), plan.held_out(name).server)


def set_workload(plan: Plan, name: str) -> Workload:
    """A set's workload: the plan's common parameters, the set's, and the plan's window."""
    params = {**plan.common, **plan.held_out(name).workload,
              "duration_s": plan.duration_s, "warmup_s": plan.warmup_s}
    return build_workload(plan.workload, params)


def planned_meta(plan: Plan, name: str, tier: str, spec: ServerSpec) -> dict[str, Any]:
    """The meta.json keys of a set's tier run that the twin reads, as the live engine will
    write them (`kvrepro.engines.live.runner`): rendered tier, workload, window."""
    workload = set_workload(plan, name)
    return {"engine": "live", "tier": tier, "tier_config": live_tier(spec, tier).meta_record(),
            "workload": workload.spec, "workload_digest": workload.digest(),
            "options": {"duration_s": plan.duration_s, "warmup_s": plan.warmup_s}}


def predict_set(plan: Plan, name: str, project_root: Path | None = None) -> pd.DataFrame:
    """The twin's metrics for every tier of set `name`: columns set, tier, metric, predicted."""
    spec = set_server(plan, name, project_root)
    profile = sim_profile(spec)
    rows = []
    for tier in plan.tiers:
        metrics = validate.predicted_metrics(planned_meta(plan, name, tier, spec), profile)
        rows += [{"set": name, "tier": tier, "metric": m, "predicted": v}
                 for m, v in metrics.items()]
    return pd.DataFrame(rows)


def set_dir(name: str, root: str | Path | None = None) -> Path:
    """A set's folder under the plan's root."""
    return Path(root or data_file("live", PREREG_ROOT)) / safe_name(name, "held-out set")


def write_predictions(plan: Plan, root: str | Path | None = None) -> list[Path]:
    """predict_set for every set, into `<set>/predictions.csv`; a set that already has runs
    is refused (its predictions would no longer be made before its recording)."""
    written = []
    for name in plan.sets:
        folder = set_dir(name, root)
        ran = [t for t in plan.tiers if (folder / t / "meta.json").exists()]
        if ran:
            raise ValueError(f"{folder}: tiers {ran} are recorded already; predictions must "
                             "come first (remove the set's runs or plan a new set)")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / PREDICTIONS
        predict_set(plan, name).to_csv(path, index=False, float_format="%.6g")
        written.append(path)
    return written


def record_set(plan: Plan, name: str, root: str | Path | None = None) -> dict[str, Any]:
    """Run set `name` live (every tier, one folder each); refused without predictions."""
    from kvrepro.engines.live.runner import LiveOptions, run_campaign
    from kvrepro.engines.live.tiers import live_tiers

    folder = set_dir(name, root)
    if not (folder / PREDICTIONS).exists():
        raise ValueError(f"{folder}: no {PREDICTIONS}; run `predict` (and commit) first")
    tiers = live_tiers(set_server(plan, name))
    options = LiveOptions(duration_s=plan.duration_s, warmup_s=plan.warmup_s)
    return run_campaign([tiers[t] for t in plan.tiers], set_workload(plan, name), folder,
                        options)


def _commit_time(path: Path) -> datetime | None:
    """When `path` was first committed (git), None if it never was."""
    out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%cI", "--", path.name],
                         cwd=path.parent, capture_output=True, text=True, check=False)
    lines = out.stdout.split()
    return datetime.fromisoformat(lines[-1]) if out.returncode == 0 and lines else None


def _run_start(tier_dir: Path) -> datetime | None:
    """A recorded run's start: meta.json's started_utc."""
    meta = read_run(tier_dir).meta
    started = meta.get("started_utc")
    return datetime.fromisoformat(started) if started else None


def protocol_table(plan: Plan, root: str | Path | None = None, drift: bool = True,
                   today: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per set and tier: when the predictions were committed, when the run started, whether
    that order holds, and how far the twin today is from the committed prediction (max |
    relative difference| over the metrics: 0 while the twin is frozen), leaving out the
    metrics redefined since the commit (`validate.REDEFINED_METRICS`, listed in
    `redefined`). `drift=False`: the order only (the drift, NaN, simulates every set).
    `today`: the twin's metrics already simulated (columns set, tier, metric, predicted, as
    `predict_set` gives them; `todays_predictions` reads them from a validation table), so
    nothing is simulated twice; a set it lacks has no drift."""
    rows = []
    for name in plan.sets:
        folder = set_dir(name, root)
        committed = _commit_time(folder / PREDICTIONS)
        stored = pd.read_csv(folder / PREDICTIONS) if (folder / PREDICTIONS).exists() else None
        now = _todays(plan, name, today) if stored is not None and drift else None
        redefined = validate.redefined_since(committed)
        for tier in plan.tiers:
            started = _run_start(folder / tier) if (folder / tier / "meta.json").exists() \
                else None
            moved = _drift(stored, now, tier, redefined) if now is not None \
                else float("nan")
            rows.append({"set": name, "tier": tier, "predicted_utc": committed,
                         "recorded_utc": started,
                         "predicted_first": bool(committed and started and committed < started),
                         "max_prediction_drift": moved, "redefined": ", ".join(redefined)})
    return pd.DataFrame(rows)


def _todays(plan: Plan, name: str, today: pd.DataFrame | None) -> pd.DataFrame | None:
    """Set `name`'s metrics by today's twin: from `today` when given (None where it lacks
    the set), else simulated now."""
    if today is None:
        return predict_set(plan, name)
    mine = today[today["set"] == name]
    return mine if len(mine) else None


def todays_predictions(table: pd.DataFrame, plan: Plan, suffix: str) -> pd.DataFrame:
    """The rows of the draw `suffix` (`validate.DRAWS`) in `validate.validation_table`'s
    table, as `predict_set` gives them (set, tier, metric, predicted = the table's `sim`).
    The table simulates each recorded run from its meta.json on the draw's own spec
    (`draw_profiles`): what `predict_set` simulates from the plan (`planned_meta` is tested
    equal to the recorded meta.json), so the protocol's drift needs no second simulation."""
    names = {validate.redrawn(name, suffix): name for name in plan.sets}
    rows = table[table["run"].isin(names)]
    return pd.DataFrame({"set": rows["run"].map(names), "tier": rows["tier"],
                         "metric": rows["metric"], "predicted": rows["sim"]})


def _drift(stored: pd.DataFrame, today: pd.DataFrame, tier: str,
           redefined: Sequence[str] = ()) -> float:
    kept = (stored.tier == tier) & ~stored.metric.isin(redefined)
    a = stored[kept].set_index("metric")["predicted"]
    b = today[today.tier == tier].set_index("metric")["predicted"]
    both = pd.concat([a, b], axis=1, keys=["stored", "today"]).dropna()
    if both.empty:
        return 0.0
    scale = both["stored"].abs().where(both["stored"] != 0, 1.0)
    return float(((both["today"] - both["stored"]).abs() / scale).max())


def stored_predictions(live_dir: str | Path | None = None) -> pd.DataFrame:
    """Every committed prediction of the package's plans under `live_dir` (default: the
    package's data/live): each draw's sets (`validate.DRAWS`) as `validate.redrawn(set,
    suffix)`; columns run, tier, metric, predicted."""
    live = Path(live_dir) if live_dir is not None else data_file("live")
    parts = []
    for folder, suffix in validate.DRAWS:
        if not plan_path(live / folder).exists():
            continue
        for name in load_plan(plan_path(live / folder)).sets:
            path = set_dir(name, live / folder) / PREDICTIONS
            if path.exists():
                parts.append(pd.read_csv(path).drop(columns="set").assign(
                    run=validate.redrawn(name, suffix)))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["run", "tier", "metric", "predicted"])


def with_predictions(table: pd.DataFrame, live_dir: str | Path | None = None) -> pd.DataFrame:
    """`validate.validation_table`'s table with the committed prediction of each held-out
    row (`predicted`, NaN for runs that were not pre-registered; `stored_predictions`) and its
    error against live (`predicted_error`, in the row's unit): the score of the frozen twin,
    whatever the twin computes today (`sim`)."""
    out = table.merge(stored_predictions(live_dir), on=["run", "tier", "metric"], how="left")
    out["predicted_error"] = [validate.metric_error(m, lv, pv) for m, lv, pv in
                              zip(out.metric, out.live, out.predicted, strict=True)]
    return out


def draw_profiles(live_dir: str | Path | None = None) -> dict[str, SimProfile]:
    """The twin of each run of a draw predicted from its own spec (a plan with `fitted_on`),
    by run name (`validate.redrawn(set, suffix)`): `validate.validation_table`'s `own`, so
    that the table's `sim` is the twin that made the committed predictions."""
    live = Path(live_dir) if live_dir is not None else data_file("live")
    own = {}
    for folder, suffix in validate.DRAWS:
        path = plan_path(live / folder)
        plan = load_plan(path) if path.exists() else None
        if plan is not None and plan.fitted_on:
            profile = sim_profile(plan_server(plan))
            own.update({validate.redrawn(name, suffix): profile for name in plan.sets})
    return own


def fit_hour_table(live_dir: str | Path | None = None, tier: str = "small-kv") -> pd.DataFrame:
    """Per draw predicted from a spec fitted on a campaign of its own (`fitted_on`), the
    machine's speed as the twin's step model sees it (`validate.lone_decode_step_ms` of
    `tier`): its fit campaign's, the earlier draws' fit campaigns' pooled (their median), and
    its recorded runs' (median, min, max); and how far each of the two fits sits from the
    runs (median over the runs of |fit / run - 1|, %). Why: a spec fitted on one campaign
    carries that hour's machine into every prediction; this shows whether pooling the fits
    of earlier hours would have predicted the runs' machine better than the fit of the hour."""
    live = Path(live_dir) if live_dir is not None else data_file("live")
    rows, fits = [], {}
    for folder, suffix in validate.DRAWS:
        plan = load_plan(plan_path(live / folder)) if plan_path(live / folder).exists() \
            else None
        if plan is None or not plan.fitted_on:
            continue
        fit_run = read_run(data_file().parent / plan.fitted_on / tier)
        pooled = float(pd.Series(fits.values()).median()) if fits else float("nan")
        fits[plan.fitted_on] = fit_ms = validate.lone_decode_step_ms(fit_run)
        recorded = [set_dir(name, live / folder) / tier for name in plan.sets]
        runs = pd.Series([validate.lone_decode_step_ms(read_run(run)) for run in recorded
                          if (run / "meta.json").exists()])
        rows.append({"draw": validate.redrawn("held-out", suffix), "fitted_on": plan.fitted_on,
                     "fit_started_utc": fit_run.meta["started_utc"], "fit_ms": fit_ms,
                     "earlier_fits_ms": pooled, "runs_median_ms": runs.median(),
                     "runs_min_ms": runs.min(), "runs_max_ms": runs.max(),
                     "fit_off_pct": 100 * (fit_ms / runs - 1).abs().median(),
                     "earlier_fits_off_pct": 100 * (pooled / runs - 1).abs().median()})
    return pd.DataFrame(rows)


def held_out_runs(plan: Plan, root: str | Path | None = None) -> dict[str, list[Path]]:
    """The recorded sets' tier folders by set name (`validate.validation_table`'s input)."""
    return {name: [set_dir(name, root) / t for t in plan.tiers
                   if (set_dir(name, root) / t / "meta.json").exists()]
            for name in plan.sets}


def main(argv: list[str] | None = None) -> int:
    """`python -m kvrepro.calibration.preregister predict | record SET | check`."""
    parser = argparse.ArgumentParser(prog="python -m kvrepro.calibration.preregister")
    parser.add_argument("action", choices=["predict", "record", "check"])
    parser.add_argument("set", nargs="?", help="record: the held-out set to run")
    parser.add_argument("--plan", help="plan.yaml (default: the package's)")
    args = parser.parse_args(argv)
    plan = load_plan(args.plan)
    root = Path(args.plan).parent if args.plan else None
    if args.action == "predict":
        for path in write_predictions(plan, root):
            print(f"wrote {path}")
    elif args.action == "record":
        if not args.set:
            parser.error("record needs a SET")
        started = datetime.now(UTC)
        results = record_set(plan, args.set, root)
        failed = {k: v for k, v in results.items() if isinstance(v, Exception)}
        print(f"set {args.set}: {len(results) - len(failed)} tiers recorded from {started:%H:%M}"
              + (f", failed: {failed}" if failed else ""))
        return 1 if failed else 0
    else:
        table = protocol_table(plan, root)
        print(table.to_string(index=False))
        return 0 if table["predicted_first"].all() else 1
    return 0



__all__ = ["PREDICTIONS", "PREREG_ROOT", "HeldOutSet", "Plan", "draw_profiles", "fit_hour_table",
           "held_out_runs",
           "load_plan", "plan_server", "planned_meta", "predict_set", "protocol_table",
           "record_set", "set_dir", "set_server", "set_workload", "stored_predictions",
           "todays_predictions", "with_predictions", "write_predictions"]


if __name__ == "__main__":
    sys.exit(main())
