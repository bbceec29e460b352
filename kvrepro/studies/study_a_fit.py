"""Study A's calibration point: one twin campaign of study A with a point's parameter values,
read into its headlines and the residuals of the fitted targets.

`kvrepro calibrate --plan data/studies/study_a.yaml` runs this on the Ray sweep
(`kvrepro.calibration.calibrate`); the stale-fit guard (`fit_residuals` on the shipped
files, seed 0) and `make reproduce`'s residual table read the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvrepro.calibration.calibrate import RESIDUAL_PREFIX, apply_point, load_plan
from kvrepro.studies.fits import fit_residuals
from kvrepro.studies.reference import compare
from kvrepro.studies.study_a import (
    STUDY_A_PLAN,
    check_targets,
    simulate_study_a,
    study_a_workload,
    targets_met,
)
from kvrepro.studies.study_a_headlines import StudyASettings, study_a_headlines
from kvrepro.sweep import point_function
from kvrepro.tier_spec import ServerSpec

POINT_VERSION = "1"


def campaign_headlines(plan_path: str | Path, point: Mapping[str, Any], seed: int
                       ) -> dict[str, float]:
    """Study A's headlines (reference ids) of one twin campaign: the plan's files with the
    point's parameter values, on the workload of `seed`."""
    server, campaign = apply_point(plan_path, point)
    spec = ServerSpec.model_validate(server)
    workload = study_a_workload(seed, workload=campaign["workload"])
    run = simulate_study_a(spec, campaign["tiers"], workload,
                           warmup_s=campaign["workload"]["warmup_s"],
                           max_in_flight=campaign.get("max_in_flight"))
    settings = StudyASettings(bin_s=campaign["bin_s"],
                              run_s=campaign["workload"]["duration_s"],
                              dram_capacity_bytes=run.dram_capacity_bytes)
    return study_a_headlines(run.records, run.samples, settings)


@point_function(POINT_VERSION)
def calibration_point(point: Mapping[str, Any]) -> dict[str, Any]:
    """A sweep point of study A's calibration: headlines, `residual_<id>` of every fitted
    target, and how many predicted targets the run meets (reported, not fitted to)."""
    plan_path = point.get("plan", str(STUDY_A_PLAN))
    plan = load_plan(plan_path)
    headlines = campaign_headlines(plan_path, point, int(point.get("seed", plan.calibration.seed)))
    residuals = fit_residuals(headlines, list(plan.calibration.targets))
    counts = targets_met(check_targets(compare(headlines)))
    return {**headlines, **{RESIDUAL_PREFIX + t: r for t, r in residuals.items()},
            "predicted_met": counts["predicted_met"], "predicted": counts["predicted"]}


def shipped_fit(plan_path: str | Path = STUDY_A_PLAN, seed: int | None = None,
                **changes: Any) -> dict[str, float]:
    """Residuals of the fitted targets for the shipped files (seed: the plan's), with
    `changes` (parameter name -> value) applied: the stale-fit guard's numbers."""
    plan = load_plan(plan_path)
    seed = plan.calibration.seed if seed is None else seed
    headlines = campaign_headlines(plan_path, changes, seed)
    return fit_residuals(headlines, list(plan.calibration.targets))
