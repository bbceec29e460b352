"""Figures of block-hash trace analysis: B2's KV working set by tier, KV write volume, and
reuse hit ratios (data from `kvrepro.analysis.block_traces`)."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd

from kvrepro.plots import require_columns

TIER_ORDER = ("HBM", "DRAM", "SSD", "overflow")
TIER_FILL = {"HBM": "#2ca02c", "DRAM": "#1f77b4", "SSD": "#d62728", "overflow": "#7f7f7f"}


def b2_working_set(df: pd.DataFrame, tier_limits_gb: dict[str, float] | None = None,
                   warmup_min: float | None = None,
                   title: str = "B2: KV working set by the tier it lands in",
                   definition: str | None = None, trace_label: str | None = None) -> plt.Figure:
    """Stacked area of the KV working set over time, by tier (HBM, DRAM, SSD, overflow).

    `df` is tidy (time_min, tier, gb), as `tiered_working_set` returns. `tier_limits_gb` draws
    the cumulative tier boundaries (e.g. {"HBM": 90, "HBM+DRAM": 465}); `warmup_min` shades
    the first minutes, where the TTL window is not yet full of history. `definition` (what a
    block counts for, e.g. "full blocks only") goes under the title and `trace_label` (e.g.
    "stand-in trace") into the total's legend entry, so a reader sees what was measured on
    what without the notebook.
    """
    require_columns(df, ["time_min", "tier", "gb"], "B2")
    wide = df.pivot_table(index="time_min", columns="tier", values="gb", aggfunc="sum")
    tiers = [t for t in TIER_ORDER if t in wide.columns and wide[t].max() > 0]
    fig, ax = plt.subplots(figsize=(11, 6.5))
    ax.stackplot(wide.index, *[wide[t] for t in tiers], labels=tiers,
                 colors=[TIER_FILL[t] for t in tiers], alpha=0.85)
    total = wide.sum(axis=1)
    ax.plot(wide.index, total, color="black", linewidth=1.5,
            label="total" if trace_label is None else f"total, {trace_label}")
    if warmup_min:
        ax.axvspan(wide.index.min(), warmup_min, color="0.9", zorder=0, label="TTL warm-up")
    for name, limit in (tier_limits_gb or {}).items():
        ax.axhline(limit, color="0.25", linestyle="--", linewidth=1.2)
        ax.text(wide.index.max(), limit, f"{name} {limit:,.0f} GB ", ha="right", va="bottom",
                fontsize=11, color="0.25")
    _annotate_peak(ax, total[total.index >= (warmup_min or total.index.min())])
    full_title = title if definition is None else f"{title}\nworking set: {definition}"
    ax.set(xlabel="trace time (min)", ylabel="KV working set (GB)", title=full_title,
           ylim=(0, max(total.max(), *(tier_limits_gb or {0: 0}).values()) * 1.18))
    ax.yaxis.set_major_formatter(mticker.StrMethodFormatter("{x:,.0f}"))
    ax.legend(loc="upper left", fontsize=11, ncol=2, framealpha=0.95)
    return fig


def _annotate_peak(ax: plt.Axes, total: pd.Series) -> None:
    """Label the peak, aligned so the text stays inside the axes near either edge."""
    peak_t, lo, hi = total.idxmax(), total.index.min(), total.index.max()
    where = (peak_t - lo) / (hi - lo) if hi > lo else 0.5
    align = "right" if where > 0.8 else "left" if where < 0.2 else "center"
    ax.annotate(f"peak {total.max():,.0f} GB", (peak_t, total.max()), xytext=(0, 10),
                textcoords="offset points", ha=align, fontsize=12)


def kv_write_volume(df: pd.DataFrame, reference_tb_per_day: float | None = None) -> plt.Figure:
    """KV write volume a write-through tier absorbs: per hour over time, and per day.

    `df` is `write_volume`'s per-bin table with a `trace` column (one or more traces). Left:
    write rate per bin in GB per hour; right: the whole trace's rate scaled to TB per day,
    split into first writes and rewrites after TTL expiry.
    """
    require_columns(df, ["trace", "bin_start_s", "bin_end_s", "write_bytes", "first_write_bytes",
                         "rewrite_bytes", "covered_s", "write_gb_per_hour"], "kv-write-volume")
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.8), layout="constrained",
                                      gridspec_kw={"width_ratios": [3, 2]})
    for trace, rows in df.groupby("trace", sort=False):
        edges = np.r_[rows.bin_start_s, rows.bin_end_s.iloc[-1]] / 60
        left.stairs(rows.write_gb_per_hour, edges, linewidth=2.5, baseline=None, label=trace)
    left.set(xlabel="trace time (min)", ylabel="KV written (GB per hour)",
             title="per time bin", ylim=(0, df.write_gb_per_hour.max() * 1.15))
    left.yaxis.set_major_formatter(mticker.StrMethodFormatter("{x:,.0f}"))
    left.legend(fontsize=11)
    per_day = df.groupby("trace", sort=False)[
        ["first_write_bytes", "rewrite_bytes", "covered_s"]].sum()
    scale = 86_400 / per_day.covered_s / 1e12
    names = [textwrap.fill(str(name), 18) for name in per_day.index]
    first, rewrite = per_day.first_write_bytes * scale, per_day.rewrite_bytes * scale
    right.bar(names, first, color="#1f77b4", label="first write")
    right.bar(names, rewrite, bottom=first, color="#ff7f0e", label="rewrite after TTL")
    for i, total in enumerate(first + rewrite):
        right.text(i, total, f"{total:,.1f}", ha="center", va="bottom", fontsize=12)
    if reference_tb_per_day is not None:
        right.axhline(reference_tb_per_day, color="0.3", linestyle="--", linewidth=1.5)
        right.text(-0.4, reference_tb_per_day, f"study B8: {reference_tb_per_day:g} TB/day",
                   va="bottom", fontsize=11, color="0.3")
    right.set(ylabel="KV written (TB per day)", title="scaled to a day",
              ylim=(0, float((first + rewrite).max()) * 1.2))
    right.legend(fontsize=11, loc="upper left")
    right.tick_params(axis="x", labelsize=12)
    fig.suptitle("KV write volume of a write-through offload tier", fontweight="bold")
    return fig


def reuse_hit_ratio(df: pd.DataFrame, by_capacity: pd.DataFrame | None = None) -> plt.Figure:
    """Share of block uses served from cache, by TTL and (optionally) by LRU capacity.

    `df` is `hit_ratio_by_ttl` with a `trace` column; `by_capacity` is `hit_ratio_by_capacity`
    with a `trace` column. Hit ratios count uses of blocks (first uses are misses).
    """
    require_columns(df, ["trace", "ttl_min", "hit_ratio"], "kv-reuse-hit-ratio")
    panels = 1 if by_capacity is None else 2
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 5.8), layout="constrained",
                             squeeze=False)
    ax = axes[0, 0]
    for trace, rows in df.groupby("trace", sort=False):
        ax.plot(rows.ttl_min, rows.hit_ratio * 100, marker="o", linewidth=2.5, label=trace)
    _log_ticks(ax, df.ttl_min)
    ax.set(xlabel="TTL (min, log scale)", ylabel="block uses that hit (%)", title="by TTL",
           ylim=(0, 100))
    ax.legend(fontsize=11)
    if by_capacity is not None:
        require_columns(by_capacity, ["trace", "capacity_gb", "hit_ratio"], "kv-reuse-hit-ratio")
        ax = axes[0, 1]
        for trace, rows in by_capacity.groupby("trace", sort=False):
            ax.plot(rows.capacity_gb, rows.hit_ratio * 100, marker="o", linewidth=2.5,
                    label=trace)
        _log_ticks(ax, by_capacity.capacity_gb)
        ax.set(xlabel="LRU capacity (GB, log scale)", ylabel="block uses that hit (%)",
               title="by LRU capacity", ylim=(0, 100))
    fig.suptitle("KV reuse: hit ratio", fontweight="bold")
    return fig


def _log_ticks(ax: plt.Axes, values: pd.Series) -> None:
    """Log x axis labelled at the data's own values (when few), in plain numbers."""
    ax.set_xscale("log")
    ticks = np.asarray(sorted(values.unique()))
    if len(ticks) <= 9:
        ax.set_xticks(ticks, [f"{t:,.0f}" if t >= 1 else f"{t:g}" for t in ticks], fontsize=11)
        ax.xaxis.set_minor_formatter(mticker.NullFormatter())
