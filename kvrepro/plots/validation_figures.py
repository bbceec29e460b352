"""Figure `sim-validation`: the digital twin's predictions next to the live engine's numbers.

Input is the tidy table of `kvrepro.calibration.validate.validation_table` (run, tier, metric, live,
sim, error_pct). One panel per metric, paired bars live / sim per (run, tier), the
relative error written over each pair and set in red when it misses the tolerance, so the
reader sees at a glance which numbers the simulator reproduces and which it does not.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.patches import Patch

from kvrepro.plots import require_columns

LIVE_COLOR, SIM_COLOR, MISS_COLOR = "0.55", "#0173b2", "#d55e00"
METRIC_AXES = {  # metric -> (panel title, y label, scale from the table's unit)
    "ttft_median_s": ("Median TTFT", "ms", 1e3),
    "ttft_p90_s": ("p90 TTFT", "ms", 1e3),
    "total_tok_s": ("Total throughput", "tok/s (prompt + output)", 1.0),
    "cached_share": ("Cached-token share", "% of prompt tokens", 100.0),
    "output_tok_s": ("Output throughput", "tok/s", 1.0),
    "l1_hit_share": ("Prompt tokens from L1", "% of prompt tokens", 100.0),
    "l2_hit_share": ("Prompt tokens from L2 (disk)", "% of prompt tokens", 100.0),
    "l1_fill_s": ("L1 fill (first eviction)", "s into the run", 1.0),
    "resume_ttft_median_s": ("Median resume TTFT", "ms", 1e3),
    "throughput_tok_s": ("Throughput", "tok/s (prompt + output)", 1.0),
    "cross_instance_hit_share": ("Cached share of routed-away turns", "% of their prompt "
                                 "tokens", 100.0),
}


def _value_label(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _error_label(err_pct: float) -> str:
    """Signed error, one decimal below 10 % (no "-0 %")."""
    if not np.isfinite(err_pct):
        return "n/a"
    digits = 1 if abs(err_pct) < 9.95 else 0
    value = round(err_pct, digits)
    return f"{value:+.{digits}f} %" if value != 0 else f"{0:.{digits}f} %"


def _panel(ax: Axes, part: pd.DataFrame, metric: str, tolerance_pct: float) -> None:
    """Paired bars of one metric, errors annotated over each pair."""
    title, ylabel, scale = METRIC_AXES.get(metric, (metric, "", 1.0))
    x, width = np.arange(len(part)), 0.38
    live, sim = part["live"].to_numpy(float) * scale, part["sim"].to_numpy(float) * scale
    ax.bar(x - width / 2, live, width, color=LIVE_COLOR)
    ax.bar(x + width / 2, sim, width, color=SIM_COLOR)
    top = np.nanmax(np.r_[live, sim, 0.0])
    for i, err in enumerate(part["error_pct"].to_numpy(float)):
        miss = not np.isfinite(err) or abs(err) > tolerance_pct
        ax.text(x[i], np.nanmax([live[i], sim[i], 0.0]) + 0.03 * top, _error_label(err),
                ha="center",
                va="bottom", fontsize=13, fontweight="bold",
                color=MISS_COLOR if miss else "0.2")
    ax.set_xticks(x, [f"{r}\n{t}" for r, t in zip(part["run"], part["tier"], strict=True)],
                  fontsize=12)
    ax.set_ylim(0, top * 1.2 if top > 0 else 1.0)
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: _value_label(v)))
    ax.set(title=title, ylabel=ylabel, xlabel="")
    ax.title.set_fontsize(16)


def sim_validation(table: pd.DataFrame, tolerance_pct: float = 20.0,
                   title: str = "Simulator vs live engine") -> plt.Figure:
    """Live vs simulated value of every metric, run and tier (figure `sim-validation`).

    `table`: tidy rows (run, tier, metric, live, sim, error_pct), metrics in table
    order; values in the table's units (seconds, tok/s, fraction), drawn in ms, tok/s and %.
    """
    require_columns(table, ["run", "tier", "metric", "live", "sim", "error_pct"],
                    "sim-validation")
    metrics = list(dict.fromkeys(table["metric"]))
    ncols = 2 if len(metrics) > 1 else 1
    nrows = -(-len(metrics) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(14, 4.6 * nrows + 1.2), squeeze=False)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        _panel(ax, table[table["metric"] == metric], metric, tolerance_pct)
    for ax in list(axes.flat)[len(metrics):]:
        ax.set_visible(False)
    handles = [Patch(color=LIVE_COLOR, label="live engine"),
               Patch(color=SIM_COLOR, label="simulator")]
    fig.legend(handles=handles, loc="upper left", ncol=2, fontsize=13, frameon=False,
               bbox_to_anchor=(0.0, 0.98))
    fig.suptitle(title, fontsize=18, fontweight="bold", x=0.01, ha="left", y=0.995)
    fig.text(0.99, 0.958, f"over each pair: simulator's error vs live "
             f"(orange: beyond ±{tolerance_pct:g} %)", ha="right", va="center", fontsize=13,
             color="0.25")
    fig.tight_layout(rect=(0, 0, 1, 0.975))
    return fig


def sim_validation_errors(table: pd.DataFrame, tolerance_pct: float = 10.0,
                          ax: Axes | None = None) -> plt.Figure:
    """Signed error of every (run, tier) and metric as one annotated grid (figure
    `sim-validation-errors`): blue where the twin is low, red where high, blank where a
    metric does not apply (no offload hits in a baseline, an L1 that never filled); cells
    beyond the tolerance are outlined."""
    require_columns(table, ["run", "tier", "metric", "error_pct"], "sim-validation-errors")
    grid = table.pivot_table(index=["run", "tier"], columns="metric", values="error_pct",
                             sort=False, dropna=False)
    grid = grid[[m for m in dict.fromkeys(table["metric"]) if m in grid.columns]]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.35 * grid.shape[1] + 3, 0.5 * grid.shape[0] + 2.2))
    values = grid.to_numpy(float)
    ax.imshow(np.clip(values, -50, 50), cmap="RdBu_r", vmin=-50, vmax=50, aspect="auto")
    for (i, j), err in np.ndenumerate(values):
        if np.isfinite(err):
            ax.text(j, i, _error_label(err), ha="center", va="center", fontsize=10,
                    fontweight="bold" if abs(err) > tolerance_pct else "normal")
    ax.set_xticks(range(grid.shape[1]),
                  [METRIC_AXES.get(m, (m,))[0] for m in grid.columns], rotation=30, ha="right")
    ax.set_yticks(range(grid.shape[0]), [f"{r} · {t}" for r, t in grid.index])
    ax.set_title(f"Simulator's signed error vs live (bold: beyond ±{tolerance_pct:g} %; "
                 "blank: does not apply)", fontsize=12, loc="left")
    ax.figure.tight_layout()
    return ax.figure


__all__ = ["METRIC_AXES", "sim_validation", "sim_validation_errors"]
