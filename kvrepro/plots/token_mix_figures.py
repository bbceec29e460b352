"""Figure A1 (the token mix of Claude Code traffic) and the sweep of what shapes it."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter, NullFormatter

from kvrepro.analysis.token_mix import MIX_LABELS, MIX_TYPES
from kvrepro.plots import require_columns


def _pct_label(value: float) -> str:
    """Two decimals like the study (98.16 %), more digits for the tiny shares."""
    if value != value:  # NaN
        return ""
    return f"{value:.2f} %" if value >= 0.1 else f"{value:.2g} %"


def _log_pct_axis(ax: plt.Axes, axis: str = "x") -> None:
    """Log scale with plain percent ticks (0.01 ... 100), since shares span four decades."""
    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    if axis == "x":
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(fmt)
    else:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(fmt)


def a1_token_mix(df: pd.DataFrame) -> plt.Figure:
    """A1: share of all tokens by type, one bar per type and series, on a log axis.

    `df`: `token_mix` output (token_type, share_pct) with an optional `series` column (e.g.
    this export vs the study). Log scale because cache reads (~98 %) dwarf uncached input
    (~0.02 %): on a linear axis three of the four bars would be invisible.
    """
    require_columns(df, ["token_type", "share_pct"], "A1")
    data = df.assign(series=df["series"] if "series" in df else "this export",
                     label=df.token_type.map(MIX_LABELS).fillna(df.token_type))
    order = [MIX_LABELS[t] for t in MIX_TYPES if t in set(data.token_type)]
    fig, ax = plt.subplots(figsize=(12, 6.5))
    sns.barplot(data=data, y="label", x="share_pct", hue="series", order=order, orient="h",
                ax=ax)
    for container in ax.containers:
        ax.bar_label(container, labels=[_pct_label(v) for v in container.datavalues],
                     padding=6, fontsize=13)
    _log_pct_axis(ax, "x")
    low = max(data.share_pct[data.share_pct > 0].min() / 3, 1e-4) if (data.share_pct > 0).any() \
        else 1e-3
    ax.set_xlim(low, 1000)
    ax.set(xlabel="share of all tokens (%, log scale)", ylabel="",
           title="A1 · Claude Code token mix: tokens by type")
    ax.legend(title=None, fontsize=12, loc="lower right")
    return fig


def tokenmix_sweep(df: pd.DataFrame, study_pct: Mapping[str, float] | None = None) -> plt.Figure:
    """Token shares against mean session length, one panel per token type; colour = mean
    pause, line style = cache TTL. `study_pct` (token type -> %) draws the study's shares.

    `df`: `mix_sweep` output. Shows which assumption the synthetic mix is sensitive to:
    longer sessions raise the cache-read share, long pauses under a short TTL re-create
    prefixes (cache creation), output and uncached input shrink as contexts grow.
    """
    require_columns(df, ["mean_turns", "pause_mean_s", "ttl_s", "token_type", "share_pct"],
                    "tokenmix-sweep")
    data = df.assign(pause=df.pause_mean_s.map(lambda s: f"{s:g} s"),
                     ttl=df.ttl_s.map(lambda s: f"{s / 60:g} min"))
    fig, axes = plt.subplots(2, 2, figsize=(15, 10), layout="constrained", sharex=True)
    for ax, token_type in zip(axes.flat, MIX_TYPES, strict=True):
        part = data[data.token_type == token_type]
        sns.lineplot(data=part, x="mean_turns", y="share_pct", hue="pause", style="ttl",
                     markers=True, linewidth=2.5, ax=ax, legend=token_type == "cache_read")
        if study_pct and token_type in study_pct:
            ax.axhline(study_pct[token_type], color="0.2", linestyle=":", linewidth=2)
            ax.annotate("study", (1.0, study_pct[token_type]), xycoords=("axes fraction",
                        "data"), ha="right", va="bottom", fontsize=12, color="0.2")
        spread = part.groupby("mean_turns").share_pct.agg(lambda v: v.max() - v.min())
        if len(part) and (spread <= 1e-3 * part.share_pct.abs().max()).all():
            ax.text(0.03, 0.05, "same for every pause and TTL", transform=ax.transAxes,
                    ha="left", va="bottom", fontsize=12, color="0.3")
        ax.set_xscale("log")
        ax.set_xticks(sorted(data.mean_turns.unique()))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(title=MIX_LABELS[token_type], xlabel="mean session length (requests, log)",
               ylabel="share of all tokens (%)")
    legend = axes.flat[0].get_legend()
    if legend is not None:
        handles, labels = axes.flat[0].get_legend_handles_labels()
        legend.remove()
        labels = [{"pause": "mean pause", "ttl": "cache TTL"}.get(lab, lab) for lab in labels]
        fig.legend(handles, labels, loc="outside right center", fontsize=12)
    fig.suptitle("Token mix vs session length, pauses and cache TTL (synthetic sessions)",
                 fontweight="bold")
    return fig
