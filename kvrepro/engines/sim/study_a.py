"""Study A on the simulator: its workload settings and the targets of the calibration.

The targets are the ones the calibration promises (issue "Simulator"): throughput gains,
plateaus and post-saturation levels within 20 %; retained shares within 10 points; DRAM fill
time within 10 minutes; resume medians and maxima within 30 %; tiers within 2 % of each other
over the first 10 minutes (here: early spread at most 2 %).
"""

from __future__ import annotations

import pandas as pd

# The pause between turns is not in the study; fitted to the DRAM tier's fill time (~45 min)
# and peak gain of A2 (see data/servers/study_a.yaml).
STUDY_A_PAUSE = {"kind": "lognormal", "mean_s": 60.0, "sigma": 1.0}

_RELATIVE_20 = ("A2.baseline_plateau", "A2.dram_peak_gain", "A2.flash_peak_gain",
                "A2.dram_after", "A2.flash_after", "A3.dram_peak_output", "A3.flash_output",
                "A3.dram_output_gain", "A3.flash_output_gain")
_RELATIVE_30 = ("A5.resume_median_dram", "A5.resume_median_flash", "A5.resume_median_baseline",
                "A5.resume_max_dram", "A5.resume_max_flash", "A5.resume_max_baseline")


def target_for(ref_id: str) -> tuple[str, float] | None:
    """(kind, tolerance) of an id's target: ("rel", 0.2), ("abs", 10.0) or None."""
    if ref_id in _RELATIVE_20:
        return "rel", 0.20
    if ref_id in _RELATIVE_30:
        return "rel", 0.30
    if ref_id in ("A2.dram_retained", "A2.flash_retained", "A2.dram_fill_time"):
        return "abs", 10.0
    if ref_id == "A2.early_spread":
        return "max", 2.0
    return None


def check_targets(table: pd.DataFrame) -> pd.DataFrame:
    """Add `target` (text) and `met` (bool, NaN without a target) to a compare() table."""
    targets, met = [], []
    for row in table.itertuples():
        rule = target_for(row.id)
        if rule is None:
            targets.append("")
            met.append(None)
            continue
        kind, tol = rule
        if kind == "rel":
            targets.append(f"within {tol:.0%}")
            met.append(abs(row.reproduced - row.study) <= tol * abs(row.study))
        elif kind == "abs":
            targets.append(f"within {tol:g} {row.unit}")
            met.append(abs(row.reproduced - row.study) <= tol)
        else:
            targets.append(f"at most {tol:g} {row.unit}")
            met.append(row.reproduced <= tol)
    return table.assign(target=targets, met=met)


def implied_baseline(reference: pd.DataFrame | None = None,
                     simulated: dict[str, float] | None = None) -> pd.DataFrame:
    """The baseline level each study-A ratio implies, from the study's own numbers.

    Study A states levels, shares and gains that must share one baseline: DRAM's peak is
    after / retained share, and its gain divides that by the baseline at the peak. Working
    this out shows which of the study's numbers agree with each other (and so which ones a
    single simulated run can meet together). With `simulated` (headlines of
    `analysis.study_a_headlines`), the same arithmetic is done on the simulated numbers.
    Returns `quantity, formula, study[, simulated]`, in tok/s.
    """
    from kvrepro.reference import load_reference

    ref = (reference if reference is not None else load_reference())["value"]
    rows = [("baseline total at DRAM's peak", "dram_after / dram_retained / dram_peak_gain",
             lambda v: v["A2.dram_after"] / (v["A2.dram_retained"] / 100)
             / v["A2.dram_peak_gain"]),
            ("baseline total at flash's peak", "flash_after / flash_retained / flash_peak_gain",
             lambda v: v["A2.flash_after"] / (v["A2.flash_retained"] / 100)
             / v["A2.flash_peak_gain"]),
            ("baseline total plateau", "baseline_plateau", lambda v: v["A2.baseline_plateau"]),
            ("baseline output at DRAM's peak", "dram_peak_output / dram_output_gain",
             lambda v: v["A3.dram_peak_output"] / v["A3.dram_output_gain"]),
            ("baseline output late in the run", "flash_output / flash_output_gain",
             lambda v: v["A3.flash_output"] / v["A3.flash_output_gain"])]
    table = pd.DataFrame([{"quantity": q, "formula": f, "study": fn(ref)} for q, f, fn in rows])
    if simulated is not None:
        table["simulated"] = [fn(pd.Series(simulated)) for _, _, fn in rows]
    return table
