"""Figures of study B's storage characterisation from real fio measurements: B5, B9, B10.

Inputs are what `kvrepro.storage` returns: `fio.b5_panels` (B5), chunk times from
`fio.chunk_read_times` + `profile.dram_chunk_copy_times` (B9), `parse.in_flight` (B10).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from kvrepro.plots import TIER_COLORS, require_columns
from kvrepro.storage.fio import size_text

B9_COLORS = {"DRAM": TIER_COLORS["dram"], "SSD": TIER_COLORS["flash"]}
B5_PANELS = (("request size", "request size"), ("jobs", "jobs (threads)"),
             ("targets", "targets (drives)"))


def _b5_panel(ax: plt.Axes, part: pd.DataFrame, log_x: bool) -> None:
    for series, rows in part.groupby("series", sort=True):
        style = "--" if str(series).startswith("write") else "-"
        ax.plot(rows.x, rows.norm_throughput, style, marker="o", linewidth=2, markersize=6,
                label=series)
    if log_x:
        ax.set_xscale("log", base=2)
        ticks = sorted(part.x.unique())
        ax.set_xticks(ticks, [size_text(t) for t in ticks], rotation=45, ha="right",
                      fontsize=11)
    else:
        ax.set_xticks(sorted(part.x.unique()))


def b5_ssd_parallelism(df: pd.DataFrame) -> plt.Figure:
    """Normalized throughput vs request size x I/O depth, vs jobs, vs number of targets.

    A panel with a single x value (e.g. one target) says so instead of drawing a curve.
    """
    require_columns(df, ["panel", "x", "series", "norm_throughput", "bw_bytes_s",
                         "direction"], "B5")
    fig, axes = plt.subplots(1, 3, figsize=(17, 6), sharey=True,
                             gridspec_kw={"width_ratios": [2.2, 1, 1]})
    for ax, (panel, xlabel) in zip(axes, B5_PANELS, strict=True):
        part = df[df.panel == panel]
        at_base = panel != "request size" and len(part) and "base" in part.columns
        ax.set(xlabel=xlabel, title=f"{panel}\n({part.base.iloc[0]})" if at_base else panel)
        if part.x.nunique() < 2:
            ax.plot(part.x, part.norm_throughput, "o", markersize=8)
            ax.set_xticks(sorted(part.x.unique()))
            ax.text(0.5, 0.5, f"only {panel} = {part.x.min() if len(part) else '-'} measured"
                    f"\n(give several to see scaling)", transform=ax.transAxes, ha="center",
                    va="center", fontsize=12, color="0.3", wrap=True)
            continue
        _b5_panel(ax, part, log_x=panel == "request size")
        ax.legend(fontsize=10, loc="lower right" if panel == "request size" else "best")
    best = df.groupby("direction").bw_bytes_s.max()
    scale = ", ".join(f"{d} {v / 1e9:.2f} GB/s" for d, v in best.items())
    axes[0].set_ylabel("throughput / best measured (x)")
    axes[0].set_ylim(0, 1.08)
    fig.suptitle(f"B5  SSD parallelism, measured with fio (1.0 = {scale})", fontsize=17,
                 fontweight="bold")
    fig.tight_layout()
    return fig


def b9_chunk_io_latency(df: pd.DataFrame, ax: plt.Axes | None = None) -> plt.Axes:
    """I/O time per KV chunk by chunk id: a chunk-sized SSD read vs a DRAM copy."""
    require_columns(df, ["chunk_id", "time_s", "tier"], "B9")
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 6))
    for tier, rows in df.groupby("tier", sort=False):
        ms = rows.time_s * 1e3
        ax.plot(rows.chunk_id, ms, marker="o", markersize=5, linewidth=1.8,
                color=B9_COLORS.get(str(tier)),
                label=f"{tier}: p50 {np.median(ms):.2f} ms, p99 {np.percentile(ms, 99):.2f} ms")
    ax.set_ylim(0, float(df.time_s.max()) * 1e3 * 1.15)
    ax.set(xlabel="chunk id", ylabel="I/O time per chunk (ms)",
           title="B9  Per-chunk I/O time: SSD read vs DRAM copy")
    ax.legend(fontsize=12, loc="center right")
    return ax


def _shade_final_wait(ax: plt.Axes, df: pd.DataFrame, t_ms: pd.Series) -> None:
    """Shade the end of the job, after the last submission: fio then waits for all I/Os
    still in flight together, so their completions are logged when the last one ends."""
    if "submitted" not in df.columns:
        return
    last = int(np.argmax(df.submitted.to_numpy() == df.submitted.max()))
    start_ms, left = float(t_ms.iloc[last]), int(df.in_flight.iloc[last])
    if left > 1:
        ax.axvspan(start_ms, float(t_ms.iloc[-1]), color="0.85", zorder=0,
                   label=f"job end: fio reaps the last {left} together")


def b10_io_queue_depth(df: pd.DataFrame, ax: plt.Axes | None = None,
                       iodepth: int | None = None) -> plt.Axes:
    """I/Os in flight over time; marks the first completion and the configured depth."""
    require_columns(df, ["time_ms", "in_flight"], "B10")
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 6))
    t_ms = df.time_ms - float(df.time_ms.iloc[0])
    ax.step(t_ms, df.in_flight, where="post", linewidth=1.6, color=TIER_COLORS["flash"],
            label="I/Os in flight")
    drops = np.flatnonzero(np.diff(df.in_flight.to_numpy()) < 0)
    if len(drops):
        first_ms = float(t_ms.iloc[drops[0] + 1])
        ax.axvline(first_ms, color="0.3", linestyle=":", linewidth=1.5,
                   label=f"first completion ({first_ms:.1f} ms)")
    if iodepth:
        ax.axhline(iodepth, color="0.5", linestyle="--", linewidth=1.2,
                   label=f"fio iodepth = {iodepth}")
    _shade_final_wait(ax, df, t_ms)
    ax.set_ylim(0, max(float(df.in_flight.max()), iodepth or 0) * 1.3)
    ax.set(xlabel="time (ms)", ylabel="I/O requests in flight",
           title="B10  I/O queue: build-up, then irregular completion")
    ax.legend(fontsize=11, loc="upper right", ncol=2)
    return ax


def b6_measured_vs_study(df: pd.DataFrame) -> plt.Figure:
    """Simulated B6 (TTFT / MEM per tier and prompt length), one panel per drive source.

    `drives` tells the panels apart (e.g. the study's datasheet drives, the drive measured
    here); each panel has its own y scale, since a slow drive can be many times MEM.
    """
    require_columns(df, ["drives", "tier", "label", "prompt_tokens", "norm_ttft"], "B6")
    sources = list(dict.fromkeys(df.drives))
    fig, axes = plt.subplots(1, len(sources), figsize=(8 * len(sources), 6), squeeze=False)
    for ax, source in zip(axes[0], sources, strict=True):
        part = df[(df.drives == source) & (df.tier != "mem")]
        labels = list(dict.fromkeys(part.label))
        lengths = sorted(part.prompt_tokens.unique())
        width = 0.8 / len(lengths)
        for i, tokens in enumerate(lengths):
            rows = part[part.prompt_tokens == tokens].set_index("label").loc[labels]
            bars = ax.bar(np.arange(len(labels)) + (i - (len(lengths) - 1) / 2) * width,
                          rows.norm_ttft, width * 0.95, label=f"{tokens // 1024}K tokens")
            ax.bar_label(bars, labels=[f"{v:.2f}" for v in rows.norm_ttft], fontsize=8,
                         rotation=90, padding=2)
        ax.axhline(1.0, color="0.2", linestyle="--", linewidth=1.2)
        ax.set_xticks(np.arange(len(labels)), labels)
        ax.set_ylim(0, float(part.norm_ttft.max()) * 1.2)
        ax.set(title=f"drives: {source}", ylabel="TTFT / MEM TTFT (x)")
        ax.legend(fontsize=10, loc="upper right", ncol=2)
    fig.suptitle("B6  Prompt caching on the simulator: study's drives vs measured drive",
                 fontsize=17, fontweight="bold")
    fig.tight_layout()
    return fig


__all__ = ["b10_io_queue_depth", "b5_ssd_parallelism", "b6_measured_vs_study",
           "b9_chunk_io_latency"]
