"""Figures that follow from arithmetic alone: A6, A7, A8, B3, B4, B8."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter

from kvrepro.plots import require_columns


def a6_capacity_vs_ttl(df: pd.DataFrame, tiers_bytes: dict[str, float] | None = None,
                       marks_ttl_s: tuple[float, ...] = (300, 3600)) -> plt.Figure:
    """KV capacity (TB) a tier needs vs the TTL it must hold, one line per token rate."""
    require_columns(df, ["ttl_s", "kv_bytes", "token_rate_tok_s"], "A6")
    data = df.assign(ttl_min=df.ttl_s / 60, kv_tb=df.kv_bytes / 1e12,
                     rate=df.token_rate_tok_s.map(lambda r: f"{r:,.0f} tok/s"))
    fig, ax = plt.subplots()
    rates = data.drop_duplicates("rate").sort_values("token_rate_tok_s")["rate"].tolist()
    # Sequential, ordered by rate: neighbouring rates stay apart (the categorical palette
    # gave 2,000 and 8,000 tok/s two oranges)
    sns.lineplot(data=data, x="ttl_min", y="kv_tb", hue="rate", hue_order=rates, ax=ax,
                 linewidth=3, palette=sns.color_palette("viridis_r", len(rates)))
    for ttl in marks_ttl_s:
        ax.axvline(ttl / 60, color="0.4", linestyle=":", linewidth=1.5)
        ax.text(ttl / 60, ax.get_ylim()[1] * 0.98, f" TTL {ttl / 60:g} min", va="top",
                fontsize=12, color="0.3")
    for label, cap in (tiers_bytes or {}).items():
        ax.axhline(cap / 1e12, color="0.2", linestyle="--", linewidth=1.5)
        # beside the axes at its line's height: inside, the line, a rate's line or the grid
        # runs through the text wherever it goes
        ax.annotate(label, (1, cap / 1e12), xycoords=("axes fraction", "data"),
                    xytext=(6, 0), textcoords="offset points", va="center", fontsize=12)
    model = df["model"].iloc[0] if "model" in df else ""
    ax.set(xlabel="TTL (min)", ylabel="KV capacity needed (TB)",
           title=f"A6  KV capacity vs TTL ({model})")
    handles, labels = ax.get_legend_handles_labels()  # highest rate on top, as its line
    ax.legend(handles[::-1], labels[::-1], title="token throughput", fontsize=12,
              title_fontsize=12, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def a7_dwpd_vs_write_rate(df: pd.DataFrame, rating_dwpd: float | None = None,
                          measured_rate_bytes_s: float | None = None) -> plt.Figure:
    """Drive writes per day vs sustained KV write rate, per RAID level, against the rating."""
    require_columns(df, ["write_rate_bytes_s", "dwpd", "raid_level"], "A7")
    data = df.assign(write_gb_s=df.write_rate_bytes_s / 1e9)
    fig, ax = plt.subplots()
    sns.lineplot(data=data, x="write_gb_s", y="dwpd", hue="raid_level", ax=ax, linewidth=3)
    if rating_dwpd is not None:
        ax.axhline(rating_dwpd, color="black", linestyle="--", linewidth=1.5)
        ax.text(data.write_gb_s.min(), rating_dwpd, f" drive rating {rating_dwpd:g} DWPD",
                va="bottom", fontsize=12)
    if measured_rate_bytes_s is not None:
        ax.axvline(measured_rate_bytes_s / 1e9, color="0.4", linestyle=":", linewidth=1.5)
        near = (data.write_rate_bytes_s - measured_rate_bytes_s).abs()
        at = data[near < 1e-3 * measured_rate_bytes_s]
        for _, row in at.iterrows():
            ax.annotate(f"{row.dwpd:.2f}", (row.write_gb_s, row.dwpd), xytext=(8, -4),
                        textcoords="offset points", fontsize=13, fontweight="bold")
    ax.set(xlabel="sustained KV write rate (GB/s)", ylabel="drive writes per day (DWPD)",
           title="A7  Drive endurance vs KV write rate")
    ax.legend(title="layout", fontsize=12, title_fontsize=12)
    return fig


def a8_bandwidth_headroom(df: pd.DataFrame) -> plt.Figure:
    """KV read/write traffic next to what the array delivers, with the headroom factor."""
    require_columns(df, ["what", "bw_bytes_s", "headroom", "kind"], "A8")
    data = df.assign(bw_gb_s=df.bw_bytes_s / 1e9)
    fig, ax = plt.subplots()
    sns.barplot(data=data, y="what", x="bw_gb_s", hue="kind", dodge=False, ax=ax)
    ax.set_xscale("log")
    for i, row in enumerate(data.itertuples()):
        label = f"{row.bw_gb_s:.3g} GB/s" + (f"  ({row.headroom:.1f}x headroom)"
                                              if row.kind != "capability" else "")
        ax.text(row.bw_gb_s * 1.1, i, label, va="center", fontsize=13)
    ax.set_xlim(right=data.bw_gb_s.max() * 20)
    ax.set(xlabel="bandwidth (GB/s, log scale)", ylabel="", title="A8  Bandwidth headroom")
    ax.legend(fontsize=12)
    return fig


def _seconds_label(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:g} {unit}"
    return f"{seconds / 1e-9:g} ns"


def b3_memory_hierarchy(df: pd.DataFrame) -> plt.Figure:
    """Each memory level as a latency range (log) with its relative size and KV TTL."""
    require_columns(df, ["level", "relative_size", "latency_low_s", "latency_high_s", "kv_ttl"],
                    "B3")
    fig, ax = plt.subplots(figsize=(11, 5.5))
    palette = sns.color_palette("colorblind", len(df))
    for i, row in enumerate(df.itertuples()):
        ax.plot([row.latency_low_s, row.latency_high_s], [i, i], linewidth=14,
                solid_capstyle="round", color=palette[i])
        ax.text(row.latency_high_s * 2.2, i,
                f"{_seconds_label(row.latency_low_s)}-{_seconds_label(row.latency_high_s)}"
                f"   size {row.relative_size:,g}x   TTL {row.kv_ttl}", va="center", fontsize=13)
    ax.set_xscale("log")
    ax.set_xlim(df.latency_low_s.min() / 3, df.latency_high_s.max() * 3e4)
    ax.set_yticks(range(len(df)), df.level)
    ax.invert_yaxis()
    ax.set(xlabel="access latency (s, log scale)", title="B3  Server memory hierarchy")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _seconds_label(v)))
    return fig


def b4_prefill_ttft(df: pd.DataFrame) -> plt.Figure:
    """TTFT by GPU without a cache (compute bound) and with one (link/memory bound)."""
    require_columns(df, ["gpu", "prompt_tokens", "cache", "ttft_s"], "B4")
    data = df.assign(prompt=df.prompt_tokens.map(lambda n: f"{n / 1024:g}K tokens"))
    fig, axes = plt.subplots(1, 2, figsize=(14, 6), layout="constrained")
    for ax, cache in zip(axes, ["without cache", "with cache"], strict=True):
        part = data[data.cache == cache]
        sns.barplot(data=part, x="gpu", y="ttft_s", hue="prompt", ax=ax)
        for container in ax.containers:
            ax.bar_label(container, fmt="%.3g", fontsize=11)
        ax.set(xlabel="GPU", ylabel="TTFT (s)", title=f"{cache}")
        ax.legend(fontsize=11, title="prompt", title_fontsize=11)
    fig.suptitle("B4  Prefill TTFT by GPU", fontweight="bold")
    return fig


def b8_c_bound(df: pd.DataFrame, daily_writes_tb: float | None = None) -> plt.Figure:
    """Endurance-bound capacity vs daily write volume, one panel per NAND type."""
    require_columns(df, ["preset", "nand", "daily_writes_tb", "c_bound_tb"], "B8")
    nands = list(dict.fromkeys(df.nand))
    fig, axes = plt.subplots(1, len(nands), figsize=(5.5 * len(nands), 5.5),
                             layout="constrained")
    for ax, nand in zip(list(getattr(axes, "flat", [axes])), nands, strict=True):
        part = df[df.nand == nand]
        sns.lineplot(data=part, x="daily_writes_tb", y="c_bound_tb", hue="preset",
                     style="preset", ax=ax, linewidth=3)
        if daily_writes_tb is not None:
            ax.axvline(daily_writes_tb, color="0.3", linestyle=":", linewidth=1.5)
            for _, rows in part.groupby("preset", sort=False):
                at = rows.iloc[(rows.daily_writes_tb - daily_writes_tb).abs().argmin()]
                ax.annotate(f"{at.c_bound_tb:.3g}", (at.daily_writes_tb, at.c_bound_tb),
                            xytext=(6, 4), textcoords="offset points", fontsize=13,
                            fontweight="bold")
        ax.set(xlabel="daily write volume (TB/day)", ylabel="C_bound (TB)", title=nand)
        ax.legend(fontsize=11)
    fig.suptitle("B8  Minimum SSD capacity to satisfy endurance", fontweight="bold")
    return fig
