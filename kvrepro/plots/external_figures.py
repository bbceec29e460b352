"""Figures `external-vs-published` and `external-errors`: the digital twin's predictions next to
published GPU measurements (the "external GPU cases"), and the numbers that sum them up.

Input is the tidy table of `external.csv`, one row per published number: case, metric, tier,
point, point_value, unit, published (> 0), predicted (NaN where the twin could not run the
point), error_pct (signed, 100 * (predicted - published) / published), label ("predicted" or
"fitted": a fitted number was used to set the twin's parameters, so it is no test of it),
read_off_figure, cause. The tier-effect table (`tier_effects_table`) has one row per point
where an offload tier is compared with its baseline: case, metric, point, baseline_tier,
offload_tier, published_ratio, predicted_ratio, direction_right.

Only `predicted` rows with a finite prediction count in `score` and in the titles; fitted rows
are drawn hollow, so a reader never takes them for a test of the twin.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from kvrepro import _checks
from kvrepro.plots import require_columns

LABELS = ("predicted", "fitted")
BAND_PCT = 25.0
"""The shaded band of both figures: within +-25 % of the published number."""
CLOSE_PCT = 10.0
"""The dashed lines of `external-errors` and the tighter count of `score`."""
CLIP_PCT = 300.0
"""`external-errors` draws an error beyond +-CLIP_PCT at the edge, with its value written."""
_MARKERS = ("o", "s", "D", "^", "v", "P", "X", "<", ">", "h")
_BAND_COLOR, _LINE_COLOR = "0.88", "0.25"
_TOLERANCE = 1e-9
"""An error of 10.000000000000009 % (0.33 against 0.3) counts as within 10 %."""


def _check_labels(table: pd.DataFrame, what: str) -> None:
    """A label other than predicted / fitted ("Predicted") would drop its rows silently."""
    unknown = sorted(set(table["label"].dropna()) - set(LABELS))
    if unknown or table["label"].isna().any():
        raise ValueError(f"{what}: column 'label' must be one of {list(LABELS)}, got "
                         f"{unknown or ['(missing)']}")


def score(table: pd.DataFrame) -> dict[str, float]:
    """How many of the twin's predictions lie within 10 % and 25 % of the published numbers.

    Counts rows labelled `predicted` whose `predicted` is finite (n_predicted, within_10,
    within_25 on |error_pct|, share_within_10, share_within_25: NaN where there is none);
    n_not_run: predicted rows the twin could not run (NaN); n_fitted: rows labelled
    `fitted`, which never count as reproduced.
    """
    require_columns(table, ["label", "predicted", "error_pct"], "external score")
    _check_labels(table, "external score")
    predicted = table["label"] == "predicted"
    ran = predicted & np.isfinite(table["predicted"].to_numpy(float))
    err = table.loc[ran, "error_pct"].abs().to_numpy(float)
    n = int(ran.sum())
    within_10 = int((err <= CLOSE_PCT + _TOLERANCE).sum())
    within_25 = int((err <= BAND_PCT + _TOLERANCE).sum())
    return {"n_predicted": n, "within_10": within_10, "within_25": within_25,
            "share_within_10": within_10 / n if n else math.nan,
            "share_within_25": within_25 / n if n else math.nan,
            "n_not_run": int((predicted & ~ran).sum()),
            "n_fitted": int((table["label"] == "fitted").sum())}


def case_styles(cases: list[str]) -> dict[str, tuple[tuple[float, float, float], str]]:
    """(colour, marker) per case in the order given: one style per case in both figures."""
    palette = sns.color_palette("colorblind", 10)
    return {case: (palette[i % len(palette)], _MARKERS[i % len(_MARKERS)])
            for i, case in enumerate(cases)}


def _score_line(counts: dict[str, float]) -> str:
    n = counts["n_predicted"]
    line = (f"{counts['within_25']} of {n} predictions within 25 %, "
            f"{counts['within_10']} within 10 %")
    if counts["n_not_run"]:
        line += f"; {counts['n_not_run']} not run by the twin"
    return line


def _legend(ax: Axes, cases: dict[str, tuple[tuple[float, float, float], str]],
            extra: list[object]) -> None:
    """Cases, then filled = predicted / hollow = fitted, then the reference lines; right of
    the axes, where it covers no point."""
    handles: list[object] = [Line2D([], [], ls="", marker=m, color=c, ms=9, label=case)
                             for case, (c, m) in cases.items()]
    handles += [Line2D([], [], ls="", marker="o", color="0.3", ms=9, label="predicted"),
                Line2D([], [], ls="", marker="o", color="0.3", mfc="none", ms=9,
                       label="fitted (hollow)"), *extra]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=11,
              frameon=False, borderaxespad=0)


def external_vs_published(table: pd.DataFrame, ax: Axes | None = None,
                          title: str = "Digital twin vs published GPU measurements"
                          ) -> plt.Figure:
    """Predicted (y) against published (x), both log, one point per published number
    (figure `external-vs-published`).

    Each row is drawn in its metric's own unit (seconds, tok/s, GB/s: the log axes span
    them); the line y = x and a shaded band from 0.75x to 1.25x (+-25 %); one colour and
    marker per case; fitted rows hollow, predicted filled. The title counts the predictions
    within 25 % and 10 % (`score`); rows the twin could not run are counted, not drawn.
    """
    require_columns(table, ["case", "metric", "published", "predicted", "label"],
                    "external-vs-published")
    _check_labels(table, "figure external-vs-published")
    counts = score(table.assign(error_pct=_error_pct(table)))
    styles = case_styles(list(dict.fromkeys(table["case"])))
    pub, pred = table["published"].to_numpy(float), table["predicted"].to_numpy(float)
    drawn = table[np.isfinite(pub) & np.isfinite(pred) & (pub > 0) & (pred > 0)]
    if ax is None:
        _, ax = plt.subplots(figsize=(10.5, 7.5))
    for case, (colour, marker) in styles.items():
        for label in LABELS:
            part = drawn[(drawn["case"] == case) & (drawn["label"] == label)]
            if len(part):
                ax.scatter(part["published"], part["predicted"], s=70, marker=marker,
                           facecolors=colour if label == "predicted" else "none",
                           edgecolors=colour, linewidths=1.8, zorder=3,
                           gid=f"{label}-{case}")
    values = drawn[["published", "predicted"]].to_numpy(float)
    lo, hi = (values.min() / 2, values.max() * 2) if values.size else (0.1, 10.0)
    line = np.geomspace(lo, hi, 200)
    ax.fill_between(line, (1 - BAND_PCT / 100) * line, (1 + BAND_PCT / 100) * line,
                    color=_BAND_COLOR, lw=0, zorder=1, gid="band-25")
    ax.plot(line, line, color=_LINE_COLOR, lw=1.2, zorder=2, gid="identity")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), aspect="equal")
    ax.set_xlabel("published (values in each metric's own unit, log)", fontsize=13)
    ax.set_ylabel("twin's prediction (same unit, log)", fontsize=13)
    ax.tick_params(labelsize=12)
    _legend(ax, styles, [Line2D([], [], color=_LINE_COLOR, lw=1.2, label="y = x"),
                         Patch(color=_BAND_COLOR, label=f"±{BAND_PCT:g} %")])
    ax.set_title(f"{title}\n{_score_line(counts)}", fontsize=14, loc="left")
    ax.figure.tight_layout()
    return ax.figure


def _error_pct(table: pd.DataFrame) -> pd.Series:
    """The table's error_pct, or computed from published and predicted where it has none."""
    if "error_pct" in table:
        return table["error_pct"]
    return 100 * (table["predicted"] - table["published"]) / table["published"]


def _error_tick(value: float, _: object = None) -> str:
    return f"{value:+g}" if value else "0"


def external_errors(table: pd.DataFrame, ax: Axes | None = None,
                    clip_pct: float = CLIP_PCT,
                    title: str = "Twin's signed error against published GPU numbers"
                    ) -> plt.Figure:
    """Signed error (%) of every published number, one row per case · metric · tier in the
    table's order (figure `external-errors`).

    One point per published number (its case's colour and marker; fitted hollow), a line at
    0, dashed lines at +-10 %, +-25 % shaded. The x axis is linear within +-50 % and log
    beyond; an error beyond +-`clip_pct` is drawn at the edge as an arrow-head marker with its
    value written next to it, and a row with numbers the twin could not run says how many
    in its label, so no number is hidden.
    """
    require_columns(table, ["case", "metric", "tier", "predicted", "error_pct", "label"],
                    "external-errors")
    _check_labels(table, "figure external-errors")
    _checks.positive(clip_pct=clip_pct)
    styles = case_styles(list(dict.fromkeys(table["case"])))
    keys = list(dict.fromkeys(zip(table["case"], table["metric"], table["tier"],
                                  strict=True)))
    row_of = {key: i for i, key in enumerate(keys)}
    rows = np.array([row_of[k] for k in zip(table["case"], table["metric"], table["tier"],
                                            strict=True)])
    err = table["error_pct"].to_numpy(float)
    if ax is None:
        _, ax = plt.subplots(figsize=(12, 0.45 * len(keys) + 2.4))
    ax.axvspan(-BAND_PCT, BAND_PCT, color=_BAND_COLOR, lw=0, zorder=0, gid="band-25")
    for x in (-CLOSE_PCT, CLOSE_PCT):
        ax.axvline(x, color=_LINE_COLOR, ls="--", lw=1.0, zorder=1)
    ax.axvline(0, color=_LINE_COLOR, lw=1.4, zorder=1)
    for case, (colour, marker) in styles.items():
        for label in LABELS:
            part = (table["case"] == case).to_numpy() & (table["label"] == label).to_numpy()
            for side, mark in ((0, marker), (1, ">"), (-1, "<")):
                if side == 0:
                    sel = part & (np.abs(err) <= clip_pct)
                else:
                    sel = part & (side * err > clip_pct)
                if sel.any():
                    x = np.clip(err[sel], -clip_pct, clip_pct)
                    ax.scatter(x, rows[sel], s=70, marker=mark, edgecolors=colour,
                               facecolors=colour if label == "predicted" else "none",
                               linewidths=1.8, zorder=3,
                               gid=f"{label}-{case}" + ("" if side == 0 else "-clipped"))
    for i in range(len(keys)):  # the values beyond the edge, one note per row and side
        in_row = rows == i
        for side in (1, -1):
            beyond = np.sort(err[in_row & (side * err > clip_pct)])[::side]
            if beyond.size:
                ax.annotate(", ".join(f"{v:+.0f} %" for v in beyond),
                            (side * clip_pct, i), xytext=(-side * 10, 0),
                            textcoords="offset points", ha="right" if side > 0 else "left",
                            va="center", fontsize=11, color="0.15", gid="clipped-note")
    not_run = pd.Series(~np.isfinite(err)).groupby(rows).sum()
    labels = [f"{c} · {m} · {t}" + (f" ({int(not_run[i])} not run)" if not_run[i] else "")
              for i, (c, m, t) in enumerate(keys)]
    ax.set_xscale("symlog", linthresh=2 * BAND_PCT, linscale=0.5)
    # below -100 % only where a prediction is negative: else that side ends just past -100
    left = -1.25 * (clip_pct if (err < -100).any() else min(clip_pct, 100.0))
    ax.set_xlim(left, clip_pct * 1.25)
    ticks = [t for t in (-300, -100, -50, -25, 0, 25, 50, 100, 300)
             if left < t <= clip_pct and t >= -clip_pct]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(_error_tick))
    ax.set_yticks(range(len(keys)), labels, fontsize=11)
    ax.set_ylim(max(len(keys), 1) - 0.5, -0.5)  # first row on top, as in the table
    ax.tick_params(axis="x", labelsize=12)
    ax.grid(axis="x", visible=False)  # the reference lines are the grid
    ax.set_xlabel(f"signed error, % of published (linear within ±{2 * BAND_PCT:g} %, log "
                  f"beyond; clipped at ±{clip_pct:g} %)", fontsize=13)
    _legend(ax, styles, [Line2D([], [], color=_LINE_COLOR, ls="--", lw=1.0,
                                label=f"±{CLOSE_PCT:g} %"),
                         Patch(color=_BAND_COLOR, label=f"±{BAND_PCT:g} %")])
    ax.set_title(f"{title}\n{_score_line(score(table))}", fontsize=14, loc="left")
    ax.figure.tight_layout()
    return ax.figure


def _sig(value: float, digits: int = 3) -> float:
    """`value` to `digits` significant figures (a ratio of 0.004 stays 0.004)."""
    return float(f"{value:.{digits}g}") if np.isfinite(value) else math.nan


def tier_effects_table(effects: pd.DataFrame) -> pd.DataFrame:
    """The tier effects for a notebook: per case, metric and point, the offload tier against
    its baseline as published and as the twin predicts it (ratio offload / baseline, three
    significant figures), and whether the twin has the direction right ("right", "WRONG",
    or "not run" where it has no prediction)."""
    require_columns(effects, ["case", "metric", "point", "baseline_tier", "offload_tier",
                              "published_ratio", "predicted_ratio", "direction_right"],
                    "external tier effects")
    predicted = effects["predicted_ratio"].to_numpy(float)
    direction = ["not run" if not np.isfinite(p) else "right" if bool(d) else "WRONG"
                 for p, d in zip(predicted, effects["direction_right"], strict=True)]
    return pd.DataFrame({
        "case": effects["case"].to_numpy(), "metric": effects["metric"].to_numpy(),
        "point": effects["point"].to_numpy(),
        "tiers": (effects["offload_tier"] + " / " + effects["baseline_tier"]).to_numpy(),
        "published ratio": [_sig(v) for v in effects["published_ratio"].to_numpy(float)],
        "predicted ratio": [_sig(v) for v in predicted],
        "direction": direction})


__all__ = ["BAND_PCT", "CLIP_PCT", "CLOSE_PCT", "case_styles", "external_errors",
           "external_vs_published", "score", "tier_effects_table"]
