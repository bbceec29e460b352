"""The fitted targets of every study, read off a headline table: what `kvrepro reproduce`
prints so that a fit a model change broke is seen at once.

The targets are the calibration plans' (`data/studies/*.yaml`, `calibration.targets`); a
residual is `kvrepro.calibration.calibrate.residual` with the target's rule (a bound such as
A4's "DRAM under 1 s" counts only its excess), as the calibration and its guard use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from kvrepro._paths import data_dir
from kvrepro.calibration.calibrate import load_plan, residual
from kvrepro.studies.reference import load_reference
from kvrepro.studies.study_a import target_for

FIT_COLUMNS = ["id", "study", "reproduced", "residual_pct", "tolerance_pct", "within",
               "beyond_reach", "plan"]


def residual_rule(ref_id: str) -> str:
    """"max" / "min" for a bound target (study A's A4 bounds), else "rel" (a level)."""
    rule = target_for(ref_id)
    return rule[0] if rule is not None and rule[0] in ("max", "min") else "rel"


def fit_residuals(headlines: Mapping[str, float], targets: list[str]) -> dict[str, float]:
    """Each fitted target's residual against the study's value (inf when the run did not
    produce it): what a calibration point returns and the stale-fit guard checks."""
    ref = load_reference()["value"]
    return {t: residual(headlines.get(t, math.nan), float(ref[t]), residual_rule(t))
            for t in targets}


def fitted_residuals(headlines: pd.DataFrame) -> pd.DataFrame:
    """One row per fitted target of every plan, from a `reference.compare` table (rows of the
    `fitted` kind, from the plan's `headline_source` notebook when the table has sources); a
    target the table lacks is shown with NaN and `within` False."""
    rows = []
    for path in sorted((data_dir() / "studies").glob("*.yaml")):
        plan = load_plan(path)
        tol = plan.calibration.tolerance
        for ref_id in plan.calibration.targets:
            found = headlines[(headlines["id"] == ref_id) & (headlines["kind"] == "fitted")]
            if plan.headline_source and "source" in found.columns:
                found = found[found["source"] == plan.headline_source]
            study = float(found["study"].iloc[0]) if len(found) else math.nan
            value = float(found["reproduced"].iloc[0]) if len(found) else math.nan
            res = residual(value, study, residual_rule(ref_id)) if len(found) else math.inf
            rows.append({"id": ref_id, "study": study, "reproduced": value,
                         "residual_pct": 100 * res, "tolerance_pct": 100 * tol,
                         "within": bool(abs(res) <= tol),
                         "beyond_reach": ref_id in plan.calibration.beyond_reach,
                         "plan": f"data/studies/{path.name}"})
    return pd.DataFrame(rows, columns=FIT_COLUMNS)
