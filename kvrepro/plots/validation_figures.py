"""Figure `sim-validation`: the digital twin's predictions next to the live engine's numbers.

Input is the tidy table of `kvrepro.calibration.validate.validation_table` (run, tier, metric, live,
sim, error, error_unit, ...): the error in percent, or in percentage points for a share. One
panel per metric, paired horizontal bars live / sim per (run, tier), each row named once at the
left, so that twenty runs with long names stay legible; the errors are shown once, in the
grid of figure `sim-validation-errors` (blue low, red high, bold beyond the tolerance).
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import Normalize, to_rgba
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
    "preemptions": ("Preemptions", "over the window", 1.0),
    "queue_time_mean_s": ("Mean queue time", "ms", 1e3),
    "throughput_tok_s": ("Throughput", "tok/s (prompt + output)", 1.0),
    "cross_instance_hit_share": ("Cached share of routed-away turns", "% of their prompt "
                                 "tokens", 100.0),
}


def _value_label(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _error_label(error: float, unit: str = "%") -> str:
    """Signed error in its unit (% or pp), one decimal below 10 (no "-0 %")."""
    if not np.isfinite(error):
        return "n/a"
    digits = 1 if abs(error) < 9.95 else 0
    value = round(error, digits)
    return f"{value:+.{digits}f} {unit}" if value != 0 else f"{0:.{digits}f} {unit}"


def _relative_luminance(colour: tuple[float, ...]) -> float:
    """WCAG relative luminance of an sRGB colour (0 black, 1 white)."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in colour[:3]]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def label_colour(background: str | tuple[float, ...]) -> str:
    """Black or white, whichever contrasts more with `background` (WCAG contrast ratio):
    a label must stay legible on the grid's dark red and dark blue cells."""
    lum = _relative_luminance(to_rgba(background))
    on_black, on_white = (lum + 0.05) / 0.05, 1.05 / (lum + 0.05)
    return "black" if on_black >= on_white else "white"


def _panel(ax: Axes, part: pd.DataFrame, metric: str, labels: list[str]) -> None:
    """Paired horizontal bars of one metric, one row per (run, tier) in `labels`' order; a
    row without the metric stays empty."""
    title, unit, scale = METRIC_AXES.get(metric, (metric, "", 1.0))
    rows = part.assign(label=_row_labels(part)).set_index("label").reindex(labels)
    y, height = np.arange(len(labels)), 0.4
    ax.barh(y - height / 2, rows["live"].to_numpy(float) * scale, height, color=LIVE_COLOR)
    ax.barh(y + height / 2, rows["sim"].to_numpy(float) * scale, height, color=SIM_COLOR)
    ax.set_yticks(y, labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)  # first row on top, as in the table
    ax.xaxis.set_major_locator(plt.MaxNLocator(4))
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: _value_label(v)))
    ax.set_title(title, fontsize=14, loc="left")
    ax.set_xlabel(unit, fontsize=12)
    ax.tick_params(labelsize=11)


def _row_labels(table: pd.DataFrame) -> list[str]:
    return [f"{r} · {t}" for r, t in zip(table["run"], table["tier"], strict=True)]


TOLERANCE_PCT = 10.0
"""The default of both figures' tolerance: the grid bolds the errors beyond it and the
value figure's subtitle names it, so the two must say the same (they said 20 and 10)."""


def sim_validation(table: pd.DataFrame, tolerance_pct: float = TOLERANCE_PCT,
                   title: str = "Simulator vs live engine",
                   errors_figure: str = "sim-validation-errors") -> plt.Figure:
    """Live vs simulated value of every metric, run and tier (figure `sim-validation`).

    `table`: tidy rows (run, tier, metric, live, sim, error, error_unit), metrics in table
    order; values in the table's units (seconds, tok/s, fraction), drawn in ms, tok/s and %.
    One panel per metric, one row per (run, tier) named once at the left of each panel row;
    the errors are not written here but once, in the grid `errors_figure` names
    (`sim_validation_errors`; `tolerance_pct` is named in the subtitle for its bold labels).
    """
    require_columns(table, ["run", "tier", "metric", "live", "sim", "error", "error_unit"],
                    "sim-validation")
    metrics = list(dict.fromkeys(table["metric"]))
    labels = list(dict.fromkeys(_row_labels(table)))
    ncols = min(3, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(12, (0.26 * len(labels) + 1.4) * nrows + 1.1),
                             squeeze=False, sharey=True)  # 12 in: read at the report's 960 px
    for ax, metric in zip(axes.flat, metrics, strict=False):
        _panel(ax, table[table["metric"] == metric], metric, labels)
    for ax in list(axes.flat)[len(metrics):]:
        ax.set_visible(False)
    handles = [Patch(color=LIVE_COLOR, label="live engine"),
               Patch(color=SIM_COLOR, label="simulator")]
    fig.legend(handles=handles, loc="upper right", ncol=2, fontsize=12, frameon=False,
               bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title, fontsize=17, fontweight="bold", x=0.01, ha="left", y=0.995)
    fig.text(0.01, 0.995 - 0.45 / fig.get_figheight(), "each row: one run · tier; the "
             f"simulator's errors (and which miss ±{tolerance_pct:g} %, pp for shares) are "
             f"in figure {errors_figure}", ha="left", va="top", fontsize=12, color="0.25")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.8 / fig.get_figheight()))
    return fig


ERROR_SPAN = 50.0
"""The grid's colour scale runs from -ERROR_SPAN to +ERROR_SPAN (% or pp); beyond, it clips."""


def sim_validation_errors(table: pd.DataFrame, tolerance_pct: float = TOLERANCE_PCT,
                          ax: Axes | None = None) -> plt.Figure:
    """Signed error of every (run, tier) and metric as one annotated grid (figure
    `sim-validation-errors`): blue where the twin is low, red where high, blank where a
    metric does not apply (no offload hits in a baseline, an L1 that never filled); labels
    bold beyond the tolerance (in the cell's unit, % or pp), in parentheses where the table
    marks the row not `informative` (a null twin gets as close), black or white by the
    cell's luminance (`label_colour`)."""
    require_columns(table, ["run", "tier", "metric", "error", "error_unit"],
                    "sim-validation-errors")
    order = list(dict.fromkeys(table["metric"]))

    def pivot(column: str) -> pd.DataFrame:
        return table.pivot_table(index=["run", "tier"], columns="metric", values=column,
                                 sort=False, dropna=False, aggfunc="first")

    grid = pivot("error").reindex(columns=order)
    units = table.drop_duplicates("metric").set_index("metric")["error_unit"]
    informative = (pivot("informative").reindex(index=grid.index, columns=order)
                   if "informative" in table else None)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.15 * grid.shape[1] + 3.5, 0.42 * grid.shape[0] + 2.6))
    values = grid.to_numpy(float)
    cmap, norm = plt.get_cmap("RdBu_r"), Normalize(-ERROR_SPAN, ERROR_SPAN)
    ax.imshow(np.clip(values, -ERROR_SPAN, ERROR_SPAN), cmap=cmap, norm=norm, aspect="auto")
    for (i, j), err in np.ndenumerate(values):
        if not np.isfinite(err):
            continue
        label = _error_label(err, units[grid.columns[j]])
        if informative is not None and not bool(informative.iat[i, j]):
            label = f"({label})"
        ax.text(j, i, label, ha="center", va="center", fontsize=10,
                color=label_colour(cmap(norm(np.clip(err, -ERROR_SPAN, ERROR_SPAN)))),
                fontweight="bold" if abs(err) > tolerance_pct else "normal")
    ax.set_xticks(range(grid.shape[1]), [textwrap.fill(METRIC_AXES.get(m, (m,))[0], 11)
                                         for m in grid.columns], fontsize=10)
    ax.set_yticks(range(grid.shape[0]), [f"{r} · {t}" for r, t in grid.index], fontsize=11)
    ax.grid(False)  # the theme's grid would run through the labels of the cells
    ax.set_title(textwrap.fill(
        f"Simulator's signed error vs live (% or pp for shares; bold: beyond "
        f"±{tolerance_pct:g}; (in parentheses): a null twin gets as close; blank: does not "
        "apply)", 14 * grid.shape[1]), fontsize=11, loc="left")
    ax.figure.tight_layout()
    return ax.figure


__all__ = ["ERROR_SPAN", "METRIC_AXES", "TOLERANCE_PCT", "label_colour", "sim_validation",
           "sim_validation_errors"]
