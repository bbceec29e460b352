"""Study A's headline numbers (figures A2-A5) read off its curves, with every choice in one place.

The curve functions of `kvrepro.analysis.runs` read any run; what study A reads from them
(its bins and smoothing, which tier is the baseline, its "after saturation" window, the
DRAM fill time, the reference ids A2.*-A5.*) is a study's recipe, so it lives here:
`StudyASettings` holds the choices, `study_a_rates` / `study_a_ttft` / `study_a_resumes`
are the curves figures A2-A5 draw, and `study_a_headlines` reads the same curves into the
numbers `kvrepro.studies.reference.compare` sets against the study's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from kvrepro._checks import require_columns
from kvrepro.analysis.runs import (
    THROUGHPUT_NEEDS,
    TTFT_COLUMNS,
    capacity_column,
    early_spread,
    fill_counters,
    fill_time_s,
    gain_over_baseline_at_peak,
    peak,
    plateau,
    request_ttft_s,
    resume_stats,
    smooth_rates,
    store_of,
    succeeded,
    throughput_over_time,
    ttft_over_time,
)


@dataclass(frozen=True)
class StudyASettings:
    """How `study_a_headlines` reads the runs; every choice in one place.

    A notebook builds one of these from its parameters and passes it to the curve functions
    it draws (`study_a_rates`, `study_a_ttft`, `study_a_resumes`) and to `study_a_headlines`,
    so a headline is read off the very curve the figure shows: `bin_s` is the bin width of
    the A2-A4 curves, `smooth_bins` / `smooth` their rolling window (1: unsmoothed).
    `after_window_s` is the (t0, t1) window of the "after saturation" levels (A2.*_after,
    retained shares, A3.flash_output); None means the late window (`late_window`).
    `early_window_s` bounds A2.early_spread and A4.ttft_cached. The DRAM fill time
    (`fill_time_s`) needs samples with `dram_bytes_column` for the DRAM tier and, unless they
    carry the simulator's eviction counters or capacity column, `dram_capacity_bytes`.
    """

    bin_s: float = 60.0
    run_s: float | None = None
    smooth_bins: int = 1
    smooth: str = "median"
    baseline: str = "baseline"
    dram: str = "dram"
    flash: str = "flash"
    after_window_s: tuple[float, float] | None = None
    early_window_s: float = 600.0
    dram_bytes_column: str = "dram_bytes_used"
    dram_capacity_bytes: float | None = None
    common_resumes: bool = True
    """A5 from the sessions that resumed in every tier's run only (study A's "same 11
    sessions"); False takes every tier's own resumes."""

    def smoothing(self) -> dict[str, Any]:
        """Keyword arguments of the headline functions' smoothing."""
        return {"smooth_bins": self.smooth_bins, "how": self.smooth}

    def after_window(self) -> tuple[float | None, float | None]:
        """(t0_s, t1_s) of the "after saturation" window; None ends mean the defaults."""
        return self.after_window_s if self.after_window_s is not None else (None, None)

    def roles(self, present: Iterable[str]) -> dict[str, str]:
        """Role (as used in reference ids) -> tier name, for the tiers in the data."""
        names = set(present)
        return {role: tier for role, tier in (("baseline", self.baseline), ("dram", self.dram),
                                              ("flash", self.flash)) if tier in names}


def _settings(settings: StudyASettings | None, changes: Mapping[str, Any]) -> StudyASettings:
    return replace(settings or StudyASettings(), **changes)


def study_a_rates(records: pd.DataFrame, settings: StudyASettings | None = None,
                  **changes: Any) -> pd.DataFrame:
    """The curves of figures A2 and A3 as drawn and as `study_a_headlines` reads them.

    `throughput_over_time` at `settings.bin_s` up to `settings.run_s`, then `smooth_rates`
    with `settings.smooth_bins` / `settings.smooth`: the one binning and smoothing of study
    A's throughput, so a peak or plateau in the headline table is the one in the figure.
    Keyword `changes` override fields of `settings`.
    """
    s = _settings(settings, changes)
    return smooth_rates(throughput_over_time(records, s.bin_s, s.run_s), **s.smoothing())


def study_a_ttft(records: pd.DataFrame, settings: StudyASettings | None = None,
                 **changes: Any) -> pd.DataFrame:
    """The curves of figure A4 as drawn and as `study_a_headlines` reads them: TTFT per bin
    of send time at `settings.bin_s` up to `settings.run_s`, warm-up turns left out (they
    measure the cache warm-up, not a tier)."""
    s = _settings(settings, changes)
    return ttft_over_time(records, s.bin_s, exclude_warmup=True, run_s=s.run_s)


def study_a_resumes(records: pd.DataFrame, settings: StudyASettings | None = None,
                    **changes: Any) -> pd.DataFrame:
    """The bars of figure A5 as drawn and as `study_a_headlines` reads them: `resume_stats`
    without warm-up turns, over the sessions that resumed in every tier's run unless
    `settings.common_resumes` is False."""
    s = _settings(settings, changes)
    return resume_stats(records, exclude_warmup=True, common_sessions=s.common_resumes)


def _a2_headlines(curves: pd.DataFrame, s: StudyASettings, roles: dict[str, str]
                  ) -> dict[str, float]:
    """A2's ids from `study_a_rates` curves (already smoothed: no further smoothing here)."""
    top = peak(curves, "total_tok_s").set_index("tier")["peak_tok_s"]
    after = plateau(curves, "total_tok_s", *s.after_window())
    out: dict[str, float] = {}
    gains = pd.Series(dtype=float)
    if "baseline" in roles:
        out["A2.baseline_plateau"] = after[roles["baseline"]]
        gains = gain_over_baseline_at_peak(curves, "total_tok_s", roles["baseline"])
    for role in ("dram", "flash"):
        if role in roles:
            tier = roles[role]
            if tier in gains.index:
                out[f"A2.{role}_peak_gain"] = gains[tier]
            out[f"A2.{role}_after"] = after[tier]
            out[f"A2.{role}_retained"] = 100 * after[tier] / top[tier]
    if len(roles) >= 2:
        three = curves[curves["tier"].isin(roles.values())]
        out["A2.early_spread"] = 100 * early_spread(three, "total_tok_s", s.early_window_s)
    return out


def _a3_headlines(curves: pd.DataFrame, s: StudyASettings, roles: dict[str, str]
                  ) -> dict[str, float]:
    """A3's ids from `study_a_rates` curves (already smoothed: no further smoothing here)."""
    after = plateau(curves, "output_tok_s", *s.after_window())
    out: dict[str, float] = {}
    if "dram" in roles:
        top = peak(curves, "output_tok_s").set_index("tier")["peak_tok_s"]
        out["A3.dram_peak_output"] = top[roles["dram"]]
    if "flash" in roles:
        out["A3.flash_output"] = after[roles["flash"]]
    if "baseline" in roles and "dram" in roles:
        gains = gain_over_baseline_at_peak(curves, "output_tok_s", roles["baseline"])
        out["A3.dram_output_gain"] = gains[roles["dram"]]
    if "baseline" in roles and "flash" in roles:
        out["A3.flash_output_gain"] = after[roles["flash"]] / after[roles["baseline"]]
    return out


def _a4_headlines(records: pd.DataFrame, s: StudyASettings, roles: dict[str, str],
                  dram_fill_s: float) -> dict[str, float]:
    out: dict[str, float] = {}
    data = records[records["tier"].isin(roles.values()) & ~records["is_warmup"].astype(bool)]
    early = data[succeeded(data) & ~data["is_resume"].astype(bool)
                 & (data["send_s"] < s.early_window_s)]
    if len(early):
        out["A4.ttft_cached"] = float(request_ttft_s(early).median())
    curves = study_a_ttft(data, s) if len(data) else pd.DataFrame(columns=list(TTFT_COLUMNS))
    if "baseline" in roles:
        part = curves[curves["tier"] == roles["baseline"]]
        out["A4.baseline_ttft_high"] = part.loc[
            part["bin_end_s"] <= part["bin_end_s"].max() / 2, "ttft_median_s"].max()
    if "dram" in roles and math.isfinite(dram_fill_s):
        part = curves[curves["tier"] == roles["dram"]]
        out["A4.dram_ttft_before_fill"] = part.loc[part["bin_end_s"] <= dram_fill_s,
                                                   "ttft_median_s"].max()
    out.update(_flash_late_ratio(data, s, roles))
    return out


def _flash_late_ratio(data: pd.DataFrame, s: StudyASettings, roles: dict[str, str]
                      ) -> dict[str, float]:
    """A4's "flash has the lowest TTFT of the three in the second half": flash's median TTFT
    of requests sent in the run's second half over the lowest other tier's (< 1: lowest)."""
    if "flash" not in roles or len(roles) < 2:
        return {}
    end_s = s.run_s if s.run_s is not None else float(data["send_s"].max())
    late = data[succeeded(data) & (data["send_s"] >= end_s / 2)]
    medians = request_ttft_s(late).groupby(late["tier"]).median()
    other_roles = dict(roles)
    flash_tier = other_roles.pop("flash")
    others = [medians.get(t, math.nan) for t in other_roles.values()]
    best = min(others) if others else math.nan
    return {"A4.flash_late_ratio": float(medians.get(flash_tier, math.nan) / best)}


def _a5_headlines(records: pd.DataFrame, roles: dict[str, str], common: bool
                  ) -> dict[str, float]:
    """A5's ids, per tier, from the table the figure's bars are drawn from (`study_a_resumes`).

    The normal-turn TTFT is each tier's own median (`A5.normal_ttft_<role>`): a median pooled
    over tiers mixes a recomputing baseline with cached tiers and matches no bar of A5.
    """
    data = records[records["tier"].isin(roles.values())]
    stats = study_a_resumes(data, common_resumes=common).set_index("tier")
    out: dict[str, float] = {}
    for role, tier in roles.items():
        out[f"A5.resume_median_{role}"] = stats.at[tier, "resume_ttft_median_s"]
        out[f"A5.resume_max_{role}"] = stats.at[tier, "resume_ttft_max_s"]
        out[f"A5.normal_ttft_{role}"] = stats.at[tier, "normal_ttft_median_s"]
    out["A5.resumes"] = float(stats["n_resumes"].max())
    return out


def _dram_fill_s(samples: pd.DataFrame | None, s: StudyASettings) -> float:
    """`fill_time_s` of the DRAM tier; NaN when the samples cannot tell (see its rules)."""
    if samples is None or s.dram_bytes_column not in samples.columns:
        return math.nan
    tier = s.dram if "tier" in samples.columns else None
    data = samples if tier is None else samples[samples["tier"] == tier]
    store = store_of(s.dram_bytes_column)
    if (s.dram_capacity_bytes is None and not fill_counters(data, store)
            and capacity_column(data, store) is None):
        return math.nan
    return fill_time_s(samples, s.dram_bytes_column, s.dram_capacity_bytes, tier=tier)


def study_a_headlines(records: pd.DataFrame, samples: pd.DataFrame | None = None,
                      settings: StudyASettings | None = None, **changes: Any
                      ) -> dict[str, float]:
    """Study A's headline numbers (figures A2-A5) from one run per tier, keyed by reference id.

    Values are in the unit of `data/reference/reference_numbers.csv` (shares and spreads in
    percent, gains as ratios, fill time in minutes), ready for `kvrepro.studies.reference.compare`.
    Ids whose tiers are missing, or that came out NaN or infinite (no resumes, no samples, a
    zero baseline, ...) are left out rather than reported as numbers. Keyword `changes`
    override fields of `settings` (see `StudyASettings`), e.g.
    `study_a_headlines(rec, smp, dram_capacity_bytes=512e9)`.

    Every A2/A3 number is read off `study_a_rates(records, settings)`, the curves figures A2
    and A3 draw with the same settings (bin width `bin_s`, smoothing `smooth_bins`), A4's
    binned ones off `study_a_ttft`, A5's off `study_a_resumes`.

    Definitions beyond the curve functions: A2/A3 "after" levels are plateaus over
    `after_window_s`; A3.flash_output_gain is flash's over the baseline's plateau there;
    A4.ttft_cached is the median TTFT of all tiers' normal, non-warm-up turns sent in the
    first `early_window_s`; A4.baseline_ttft_high the highest binned median in the first half
    of the run; A4.dram_ttft_before_fill the highest DRAM binned median before the fill;
    A4.flash_late_ratio flash's median TTFT in the second half over the lowest other
    tier's; A5.normal_ttft_<role> each tier's median normal-turn TTFT (A5's bars; no
    median pooled over tiers is reported); A5.resume_* and A5.resumes cover
    the sessions that resumed in every tier's run (`common_resumes`; A5.resumes is then their
    number, otherwise the most resumes any tier saw).
    """
    s = _settings(settings, changes)
    require_columns(records, [*THROUGHPUT_NEEDS, "send_s", "is_resume", "is_warmup"],
                     "study_a_headlines")
    roles = s.roles(records["tier"])
    if not roles:
        return {}
    data = records[records["tier"].isin(roles.values())]
    curves = study_a_rates(data, s)
    dram_fill_s = _dram_fill_s(samples, s)
    out = {**_a2_headlines(curves, s, roles), **_a3_headlines(curves, s, roles),
           **_a4_headlines(data, s, roles, dram_fill_s),
           **_a5_headlines(data, roles, s.common_resumes)}
    if math.isfinite(dram_fill_s):
        out["A2.dram_fill_time"] = dram_fill_s / 60
    return {k: float(v) for k, v in out.items() if pd.notna(v) and math.isfinite(float(v))}
