"""Figures of measured or simulated runs: A2-A5 of study A.

Each function takes the tidy frame of one `kvrepro.analysis.runs` function (never raw records),
so the same figure draws a live vLLM run and a simulated one:

* `a2_total_throughput`, `a3_output_throughput`: `analysis.throughput_over_time`;
* `a4_ttft_over_time`: `analysis.ttft_over_time`;
* `a5_returning_users`: `analysis.resume_stats`;
* `prompt_sources`: `analysis.prompt_tokens_by_source`.

For study A pass `kvrepro.studies.study_a_headlines`' `study_a_rates`, `study_a_ttft` and
`study_a_resumes`, with the `StudyASettings` its headlines are read with: nothing here bins
or smooths, so a figure and its headline numbers share one binning and smoothing.

Time axes are run time in minutes (bin centres), as the study's figures are. Titles default to
the study's figure ids ("A2  ..."); a figure of another run (a live run of this package) passes
its own `title`, so a reader never takes it for the study's figure.
"""

from __future__ import annotations

from collections.abc import Iterable

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from kvrepro.plots import TIER_COLORS, require_columns

_ROLE_ORDER = ("baseline", "dram", "flash")
_NORMAL_ALPHA = 0.35
_OVER_TIME_SIZE = (8.0, 5.4)
"""Size of the over-time figures: with the legend outside, about 1,100 px wide at 120 dpi, so
the report's 960 px shows their 13 pt texts at 11 pt or more."""



def _tier_order(tiers: Iterable[str]) -> list[str]:
    """Baseline, DRAM, flash first (the study's order), then any other tier as it comes."""
    seen = list(dict.fromkeys(tiers))
    return [t for t in _ROLE_ORDER if t in seen] + [t for t in seen if t not in _ROLE_ORDER]


def _tier_color(tier: str, index: int) -> tuple[float, float, float] | str:
    """The shared tier colour, or a colour-blind palette colour for an unknown tier."""
    palette = sns.color_palette("colorblind", 10)
    return TIER_COLORS.get(tier, palette[(index + 3) % len(palette)])


def _minutes(df: pd.DataFrame) -> pd.Series:
    return (df["bin_start_s"] + df["bin_end_s"]) / 2 / 60


def _mark_run_phases(ax: Axes, warmup_s: float | None, fill_time_s: float | None,
                     fill_label: str) -> None:
    """Shade the warm-up and draw the fill-time marker, each labelled on the plot."""
    if warmup_s:
        ax.axvspan(0, warmup_s / 60, color="0.85", alpha=0.6, zorder=0, linewidth=0)
        ax.text(warmup_s / 60, 0.98, " warm-up", transform=ax.get_xaxis_transform(),
                ha="left", va="top", fontsize=13, color="0.35")
    if fill_time_s is not None and np.isfinite(fill_time_s):
        ax.axvline(fill_time_s / 60, color="0.25", linestyle="--", linewidth=1.5)
        ax.text(fill_time_s / 60, 0.98, f" {fill_label}\n ({fill_time_s / 60:.3g} min)",
                transform=ax.get_xaxis_transform(), ha="left", va="top", fontsize=13,
                color="0.25")


def _rate_over_time(df: pd.DataFrame, column: str, ylabel: str, figure_id: str, title: str,
                    warmup_s: float | None, fill_time_s: float | None,
                    fill_label: str) -> plt.Figure:
    require_columns(df, ["tier", "bin_start_s", "bin_end_s", column], figure_id)
    fig, ax = plt.subplots(figsize=_OVER_TIME_SIZE)
    for i, tier in enumerate(_tier_order(df["tier"])):
        part = df[df["tier"] == tier].sort_values("bin_start_s")
        ax.plot(_minutes(part), part[column], label=tier, color=_tier_color(tier, i),
                linewidth=3)
    _mark_run_phases(ax, warmup_s, fill_time_s, fill_label)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.12)  # headroom for the phase labels
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set(xlabel="run time (min)", ylabel=ylabel, title=title)
    # outside the axes: inside, "best" only dodges the lines, not the phase labels
    ax.legend(title="tier", fontsize=13, title_fontsize=13, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def a2_total_throughput(df: pd.DataFrame, warmup_s: float | None = None,
                        fill_time_s: float | None = None,
                        fill_label: str = "DRAM tier full",
                        title: str = "A2  Total throughput over time") -> plt.Figure:
    """Prefill + decode tokens/s of the whole server over the run, one line per tier.

    Prompt tokens count whether computed or served from cache, as study A counts them.
    `warmup_s` shades the cache warm-up; `fill_time_s` marks when a tier filled.
    """
    return _rate_over_time(df, "total_tok_s", "total throughput (tok/s)", "A2", title,
                           warmup_s, fill_time_s, fill_label)


def a3_output_throughput(df: pd.DataFrame, warmup_s: float | None = None,
                         fill_time_s: float | None = None,
                         fill_label: str = "DRAM tier full",
                         title: str = "A3  Output throughput over time") -> plt.Figure:
    """Decode (output) tokens/s over the run, one line per tier."""
    return _rate_over_time(df, "output_tok_s", "output throughput (tok/s)", "A3", title,
                           warmup_s, fill_time_s, fill_label)


def a4_ttft_over_time(df: pd.DataFrame, p90_band: bool = True, warmup_s: float | None = None,
                      fill_time_s: float | None = None,
                      fill_label: str = "DRAM tier full",
                      title: str = "A4  Time to first token over time") -> plt.Figure:
    """Median TTFT per bin of send time (log scale), with an optional median-to-p90 band.

    Log scale because the tiers differ by orders of magnitude once the baseline recomputes:
    0.5 s and 10 s must both stay readable.
    """
    needs = ["tier", "bin_start_s", "bin_end_s", "ttft_median_s"]
    require_columns(df, needs + (["ttft_p90_s"] if p90_band else []), "A4")
    fig, ax = plt.subplots(figsize=_OVER_TIME_SIZE)
    for i, tier in enumerate(_tier_order(df["tier"])):
        part = df[df["tier"] == tier].sort_values("bin_start_s")
        part = part[part["ttft_median_s"] > 0]
        color = _tier_color(tier, i)
        ax.plot(_minutes(part), part["ttft_median_s"], label=tier, color=color, linewidth=3)
        if p90_band:
            ax.fill_between(_minutes(part), part["ttft_median_s"], part["ttft_p90_s"],
                            color=color, alpha=0.18, linewidth=0)
    ax.set_yscale("log")
    if warmup_s or fill_time_s is not None:  # headroom for the phase labels: 18 % of the decades
        low, high = ax.get_ylim()
        ax.set_ylim(low, high * (high / low) ** 0.18)
    _mark_run_phases(ax, warmup_s, fill_time_s, fill_label)
    ax.set_xlim(left=0)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set(xlabel="run time at send (min)", ylabel="median TTFT (s, log scale)", title=title)
    handles, labels = ax.get_legend_handles_labels()
    if p90_band:
        handles.append(Patch(color="0.5", alpha=0.3, linewidth=0))
        labels.append("median to p90")
    # outside the axes, as A2's: inside, "best" lands on the p90 bands (it dodges lines only)
    ax.legend(handles, labels, title="tier", fontsize=13, title_fontsize=13, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def _a5_bars(ax: Axes, row: pd.Series, x: float, width: float, color: object) -> None:
    normal, resume, slowest = (row["normal_ttft_median_s"], row["resume_ttft_median_s"],
                               row["resume_ttft_max_s"])
    ax.bar(x - width / 2, normal, width, color=color, alpha=_NORMAL_ALPHA)
    ax.bar(x + width / 2, resume, width, color=color)
    if np.isfinite(normal):
        ax.text(x - width / 2, normal, f"{normal:.2g} s", ha="center", va="bottom",
                fontsize=13)
    if not np.isfinite(resume):  # a tier without resumes: say so instead of "nan s"
        ax.text(x + width / 2, 0, "no\nresumes", ha="center", va="bottom", fontsize=12)
        return
    label, top = f"{resume:.2g} s", resume
    if np.isfinite(slowest):
        ax.errorbar(x + width / 2, resume, yerr=[[0], [slowest - resume]], color="0.15",
                    capsize=8, linewidth=2)
        label, top = f"{label}\nmax {slowest:.3g} s", slowest
    # One label over the whisker: median and max stacked, so they can never overlap.
    ax.text(x + width / 2, top, label, ha="center", va="bottom", fontsize=13,
            fontweight="bold")


def a5_returning_users(df: pd.DataFrame,
                       title: str = "A5  Returning users: TTFT of a resume") -> plt.Figure:
    """Normal-turn vs resume median TTFT per tier; the whisker reaches the slowest resume.

    A resume after a long idle is where tiers differ most: its KV either survived in a
    lower tier (a load) or must be recomputed from scratch (the baseline).
    """
    require_columns(df, ["tier", "normal_ttft_median_s", "resume_ttft_median_s",
                  "resume_ttft_max_s"], "A5")
    tiers = _tier_order(df["tier"])
    data = df.set_index("tier").loc[tiers]
    fig, ax = plt.subplots()
    width = 0.36
    for i, tier in enumerate(tiers):
        _a5_bars(ax, data.loc[tier], i, width, _tier_color(tier, i))
    counts = data["n_resumes"] if "n_resumes" in data else None
    ax.set_xticks(range(len(tiers)),
                  [f"{t}\n({counts[t]:.0f} resumes)" if counts is not None else t
                   for t in tiers])
    values = data[["normal_ttft_median_s", "resume_ttft_median_s", "resume_ttft_max_s"]]
    finite = values.to_numpy(dtype=float)[np.isfinite(values.to_numpy(dtype=float))]
    ax.set_ylim(0, (finite.max() if finite.size else 1.0) * 1.3)
    ax.set_xlim(-0.6, len(tiers) - 0.4)
    ax.set(xlabel="", ylabel="TTFT (s)", title=title)
    legend = [Patch(color="0.45", alpha=_NORMAL_ALPHA, label="normal turn (median)"),
              Patch(color="0.45", label="resume (median)"),
              Line2D([], [], color="0.15", linewidth=2, label="slowest resume")]
    ax.legend(handles=legend, fontsize=13, loc="best")
    return fig


_SOURCE_PARTS = (("computed_tokens", "computed", "0.75"),
                 ("engine_hit_tokens", "engine prefix cache", "#2ca02c"),
                 ("offload_l1_tokens", "offload L1 (DRAM)", "#1f77b4"),
                 ("offload_l2_tokens", "offload L2 (disk)", "#d62728"))


def prompt_sources(df: pd.DataFrame, title: str = "Prompt tokens by source") -> plt.Figure:
    """Each tier's prompt tokens split by where they came from (`analysis.prompt_tokens_by_source`):
    recomputed, the engine's own prefix cache, or the offload tier's L1 or L2. Shares of the
    tier's prompt tokens, so tiers of different lengths compare."""
    require_columns(df, ["tier", *(c for c, _, _ in _SOURCE_PARTS)], "prompt-sources")
    tiers = _tier_order(df["tier"])
    data = df.set_index("tier").loc[tiers, [c for c, _, _ in _SOURCE_PARTS]].fillna(0.0)
    shares = data.div(data.sum(axis=1).where(lambda s: s > 0), axis=0) * 100
    fig, ax = plt.subplots()
    left = np.zeros(len(tiers))
    for column, label, color in _SOURCE_PARTS:
        ax.barh(tiers, shares[column], left=left, color=color, label=label)
        left += shares[column].to_numpy()
    ax.invert_yaxis()
    ax.set(xlim=(0, 100), xlabel="share of prompt tokens (%)", ylabel="", title=title)
    ax.legend(fontsize=12, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig
