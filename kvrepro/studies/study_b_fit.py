"""Study B's calibration point: B6 on the twin with a point's per-chunk costs, read into its
headlines and the residuals of the fitted targets (`kvrepro calibrate --plan
data/studies/study_b.yaml`, `kvrepro.calibration.calibrate`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvrepro._paths import data_file
from kvrepro.calibration.calibrate import RESIDUAL_PREFIX, apply_point, load_plan
from kvrepro.engines.sim import sim_profile
from kvrepro.studies.fits import fit_residuals
from kvrepro.studies.study_b import run_b6, study_b_headlines
from kvrepro.sweep import point_function
from kvrepro.tier_spec import ServerSpec

STUDY_B_PLAN = data_file("studies", "study_b.yaml")
POINT_VERSION = "1"


def b6_headlines(plan_path: str | Path, point: Mapping[str, Any]) -> dict[str, float]:
    """B6's four ratios for the plan's server with the point's parameter values."""
    server, _ = apply_point(plan_path, point)
    return study_b_headlines(run_b6(sim_profile(ServerSpec.model_validate(server))))


@point_function(POINT_VERSION)
def calibration_point(point: Mapping[str, Any]) -> dict[str, Any]:
    """A sweep point of study B's calibration: B6's headlines and `residual_<id>` columns."""
    plan_path = point.get("plan", str(STUDY_B_PLAN))
    headlines = b6_headlines(plan_path, point)
    residuals = fit_residuals(headlines, list(load_plan(plan_path).calibration.targets))
    return {**headlines, **{RESIDUAL_PREFIX + t: r for t, r in residuals.items()}}


def shipped_fit(plan_path: str | Path = STUDY_B_PLAN, **changes: Any) -> dict[str, float]:
    """Residuals of B6's fitted targets for the shipped files, with `changes` applied."""
    targets = list(load_plan(plan_path).calibration.targets)
    return fit_residuals(b6_headlines(plan_path, changes), targets)
