"""Figures of the cost model and of prefill: A9 (tokens per dollar) and B1 (prefill anatomy)."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd

from kvrepro.plots import TIER_COLORS, require_columns

PART_COLORS = {"feed-forward": "#4c72b0", "attention": "#dd8452"}


def _tier_lines(ax: plt.Axes, df: pd.DataFrame, x: str, y: str) -> None:
    for tier, part in df.groupby("tier", sort=False):
        part = part.dropna(subset=[y])
        if len(part):
            ax.plot(part[x], part[y], label=tier, color=TIER_COLORS.get(tier), linewidth=3)


def _mark_x(ax: plt.Axes, x: float | None, label: str) -> None:
    if x is None or not math.isfinite(x):
        return
    ax.axvline(x, color="0.3", linestyle=":", linewidth=1.5)
    ax.text(x, ax.get_ylim()[1] * 0.97, f" {label}", va="top", fontsize=12, color="0.2")


def a9_tokens_per_dollar(df: pd.DataFrame, crossover_s: float | None = None,
                         price_label: str = "") -> plt.Figure:
    """Tokens per dollar over run time per tier: whole server (left), cache tier alone (right).

    `df` is `economics.tokens_per_dollar` output; `crossover_s` marks where flash overtakes
    DRAM for the whole server.
    """
    require_columns(df, ["tier", "bin_start_s", "bin_end_s", "tok_per_usd_server",
                         "tok_per_usd_tier"], "A9")
    data = df.assign(minute=(df.bin_start_s + df.bin_end_s) / 120,
                     server_m=df.tok_per_usd_server / 1e6, tier_m=df.tok_per_usd_tier / 1e6)
    fig, (left, right) = plt.subplots(1, 2, figsize=(17, 6))
    _tier_lines(left, data, "minute", "server_m")
    _tier_lines(right, data, "minute", "tier_m")
    left.set(xlabel="run time (min)", ylabel="M tokens per $", title="whole server")
    right.set(xlabel="run time (min)", ylabel="M tokens per $", title="cache tier alone")
    for ax in (left, right):
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=12)
    if crossover_s is not None and math.isfinite(crossover_s):
        _mark_x(left, crossover_s / 60, f"flash ahead from {crossover_s / 60:.0f} min")
    fig.suptitle(f"A9  Tokens per dollar over the run{f' ({price_label})' if price_label else ''}",
                 fontweight="bold", fontsize=18)
    return fig


def a9_tokens_per_dollar_vs_ttl(df: pd.DataFrame, crossover_ttl_s: float | None = None,
                                price_label: str = "") -> plt.Figure:
    """Each tier sized to retain a TTL: its hardware cost (left), tokens per dollar (right).

    `df` is `economics.tokens_per_dollar_vs_ttl` output; a tier's line ends where it no longer
    fits one server. `crossover_ttl_s` marks where flash overtakes DRAM per dollar.
    """
    require_columns(df, ["tier", "ttl_s", "tier_capex_usd", "tok_per_usd_server"], "A9 vs TTL")
    data = df.assign(ttl_min=df.ttl_s / 60, capex_k=df.tier_capex_usd / 1e3,
                     server_m=df.tok_per_usd_server / 1e6)
    fig, (left, right) = plt.subplots(1, 2, figsize=(17, 6))
    _tier_lines(left, data[data.tier != "baseline"], "ttl_min", "capex_k")
    _tier_lines(right, data, "ttl_min", "server_m")
    left.set(xlabel="TTL retained (min)", ylabel="cache tier hardware (k$)",
             title="what the tier costs")
    right.set(xlabel="TTL retained (min)", ylabel="M tokens per $ (whole server)",
              title="tokens per dollar")
    for ax in (left, right):
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=12)
    if crossover_ttl_s is not None and math.isfinite(crossover_ttl_s):
        label = f"flash ahead from TTL {crossover_ttl_s / 60:.0f} min"
        for ax in (left, right):
            _mark_x(ax, crossover_ttl_s / 60, label)
    dram = data[(data.tier == "dram") & data.server_m.notna()]
    if len(dram) and (~data[data.tier == "dram"].server_m.notna()).any():
        end = dram.iloc[-1]
        right.annotate("DRAM slots full", (end.ttl_min, end.server_m), xytext=(6, -4),
                       textcoords="offset points", fontsize=12, color=TIER_COLORS["dram"])
    fig.suptitle("A9  Tokens per dollar vs the TTL a tier retains"
                 f"{f' ({price_label})' if price_label else ''}", fontweight="bold", fontsize=18)
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
