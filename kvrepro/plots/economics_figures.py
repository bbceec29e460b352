"""Figures of the cost model and of prefill: A9 (tokens per dollar) and B1 (prefill anatomy)."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D

from kvrepro.plots import TIER_COLORS, require_columns

PART_COLORS = {"feed-forward": "#4c72b0", "attention": "#dd8452"}


_A9_SIZE = (9, 8.6)
"""A9's two panels stacked on one x axis, 9 in wide (about 1,100 px at 120 dpi): the report's
960 px shows the 14 pt legend and notes at about 12 pt, the ticks at 14 pt."""
_NOTE_SIZE = 14


def _tier_lines(ax: plt.Axes, df: pd.DataFrame, x: str, y: str) -> None:
    for tier, part in df.groupby("tier", sort=False):
        part = part.dropna(subset=[y])
        if len(part):
            ax.plot(part[x], part[y], label=tier, color=TIER_COLORS.get(tier), linewidth=3)


def _mark_x(axes: tuple[plt.Axes, ...], x: float | None, label: str) -> Line2D | None:
    """A dotted line at `x` on each of `axes`; its label goes into the legend, not onto the
    plot, where it would run over the lines."""
    if x is None or not math.isfinite(x):
        return None
    for ax in axes:
        ax.axvline(x, color="0.3", linestyle=":", linewidth=2)
    return Line2D([], [], color="0.3", linestyle=":", linewidth=2, label=label)


def _two_panels(suptitle: str) -> tuple[plt.Figure, plt.Axes, plt.Axes]:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=_A9_SIZE, sharex=True, layout="constrained")
    fig.suptitle(suptitle, fontweight="bold", fontsize=18)
    return fig, top, bottom


def _finish(fig: plt.Figure, axes: tuple[plt.Axes, ...], marker: Line2D | None) -> None:
    """y from 0 and one legend for both panels below them (tiers in the study's order)."""
    handles: dict[str, object] = {}
    for ax in axes:
        ax.set_ylim(bottom=0)
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    order = list(TIER_COLORS)
    handles = dict(sorted(handles.items(), key=lambda item: (
        order.index(item[0]) if item[0] in order else len(order))))
    if marker is not None:
        handles[marker.get_label()] = marker
    fig.legend(handles.values(), handles.keys(), loc="outside lower center",
               ncols=len(handles), fontsize=_NOTE_SIZE, frameon=False, handlelength=1.6,
               columnspacing=1.2)


def _line_end(ax: plt.Axes, data: pd.DataFrame, tier: str, y: str, label: str) -> None:
    """Mark and name where a tier's line stops (it no longer fits one server)."""
    part = data[data.tier == tier]
    shown = part[part[y].notna()]
    if not len(shown) or part[y].notna().all():
        return
    end = shown.iloc[-1]
    color = TIER_COLORS.get(tier, "0.3")
    ax.plot(end.ttl_min, end[y], marker="o", markersize=8, color=color)
    ax.annotate(label, (end.ttl_min, end[y]), xytext=(8, 0), textcoords="offset points",
                va="center", fontsize=_NOTE_SIZE, color=color)


def a9_tokens_per_dollar(df: pd.DataFrame, crossover_s: float | None = None,
                         price_label: str = "") -> plt.Figure:
    """Tokens per dollar over run time per tier: whole server (top), cache tier alone (bottom).

    `df` is `economics.tokens_per_dollar` output; `crossover_s` marks where flash overtakes
    DRAM for the whole server.
    """
    require_columns(df, ["tier", "bin_start_s", "bin_end_s", "tok_per_usd_server",
                         "tok_per_usd_tier"], "A9")
    data = df.assign(minute=(df.bin_start_s + df.bin_end_s) / 120,
                     server_m=df.tok_per_usd_server / 1e6, tier_m=df.tok_per_usd_tier / 1e6)
    fig, top, bottom = _two_panels("A9  Tokens per dollar over the run"
                                   f"{f' ({price_label})' if price_label else ''}")
    _tier_lines(top, data, "minute", "server_m")
    _tier_lines(bottom, data, "minute", "tier_m")
    top.set(ylabel="M tokens per $")
    bottom.set(xlabel="run time (min)", ylabel="M tokens per $")
    top.set_title("whole server", loc="left", fontsize=16)
    bottom.set_title("cache tier alone", loc="left", fontsize=16)
    marker = None
    if crossover_s is not None and math.isfinite(crossover_s):
        marker = _mark_x((top,), crossover_s / 60,
                         f"flash ahead (whole server) from {crossover_s / 60:.0f} min")
    _finish(fig, (top, bottom), marker)
    return fig


def a9_tokens_per_dollar_vs_ttl(df: pd.DataFrame, crossover_ttl_s: float | None = None,
                                price_label: str = "") -> plt.Figure:
    """Each tier sized to retain a TTL: its hardware cost (top), tokens per dollar (bottom).

    `df` is `economics.tokens_per_dollar_vs_ttl` output; a tier's line ends (a dot, named)
    where it no longer fits one server. `crossover_ttl_s` marks where flash overtakes DRAM per
    dollar.
    """
    require_columns(df, ["tier", "ttl_s", "tier_capex_usd", "tok_per_usd_server"], "A9 vs TTL")
    data = df.assign(ttl_min=df.ttl_s / 60, capex_k=df.tier_capex_usd / 1e3,
                     server_m=df.tok_per_usd_server / 1e6)
    fig, top, bottom = _two_panels("A9  Tokens per dollar vs the TTL a tier retains"
                                   f"{f' ({price_label})' if price_label else ''}")
    _tier_lines(top, data[data.tier != "baseline"], "ttl_min", "capex_k")
    _tier_lines(bottom, data, "ttl_min", "server_m")
    top.set(ylabel="cache tier hardware (k$)")
    bottom.set(xlabel="TTL retained (min)", ylabel="M tokens per $")
    top.set_title("what the tier costs", loc="left", fontsize=16)
    bottom.set_title("tokens per dollar (whole server)", loc="left", fontsize=16)
    marker = None
    if crossover_ttl_s is not None and math.isfinite(crossover_ttl_s):
        marker = _mark_x((top, bottom), crossover_ttl_s / 60,
                         f"flash ahead from TTL {crossover_ttl_s / 60:.0f} min")
    _line_end(bottom, data, "dram", "server_m", "DRAM slots full")
    _line_end(bottom, data, "baseline", "server_m", "VRAM full")
    _finish(fig, (top, bottom), marker)
    return fig


def b1_prefill_anatomy(df: pd.DataFrame, title: str = "",
                       study_point: tuple[float, float] | None = None) -> plt.Figure:
    """Prefill latency vs sequence length, stacked: feed-forward (linear) + attention (quadratic).

    `df` is `roofline.prefill_anatomy` output; `study_point` (tokens, ms) marks the study's
    value (B1: ~600 ms at 15K tokens).
    """
    require_columns(df, ["seq_tokens", "part", "latency_ms"], "B1")
    wide = df.pivot(index="seq_tokens", columns="part", values="latency_ms").sort_index()
    parts = [p for p in PART_COLORS if p in wide.columns]
    fig, ax = plt.subplots()
    ax.stackplot(wide.index / 1e3, *(wide[p] for p in parts), labels=parts,
                 colors=[PART_COLORS[p] for p in parts], alpha=0.85)
    if study_point is not None:
        tokens, ms = study_point
        ax.plot(tokens / 1e3, ms, marker="o", color="black", markersize=10, linestyle="none",
                label=f"study: ~{ms:g} ms at {tokens / 1e3:g}K")
    ax.set(xlabel="sequence length (K tokens)", ylabel="prefill latency (ms)",
           title=f"B1  Prefill anatomy{f' ({title})' if title else ''}")
    ax.set_xlim(0, wide.index.max() / 1e3 * 1.03)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=12)
    return fig
