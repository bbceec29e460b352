"""Figures of study B's storage characterisation from real fio measurements: B5, B9, B10.

Inputs are what `kvrepro.storage` returns: `fio.b5_panels` (B5), chunk times from
`fio.chunk_read_times` + `profile.dram_chunk_copy_times` (B9), `parse.in_flight` (B10).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from kvrepro.plots import TIER_COLORS, require_columns
from kvrepro.storage.fio import size_text

B9_COLORS = {"DRAM": TIER_COLORS["dram"], "SSD": TIER_COLORS["flash"]}
B5_STREAMS = (("jobs", "jobs (threads)", "o", "0.2"),
              ("targets", "targets (drives)", "D", TIER_COLORS["flash"]))
"""B5's right panel: one read series per way of adding parallel streams (marker, colour)."""


def _short_size(n_bytes: int) -> str:
    """4096 -> '4K', 41943040 -> '40M': fio's bs notation (K = KiB), short enough to print
    request sizes an octave apart side by side, unrotated."""
    text = size_text(n_bytes)
    return text.replace(" GiB", "G").replace(" MiB", "M").replace(" KiB", "K").replace(" B", "")


def _b5_request_size(ax: plt.Axes, part: pd.DataFrame) -> None:
    """Throughput vs request size: colour = iodepth (light to dark as it deepens), line style
    and marker = read / write; one legend below the axes, outside the data."""
    depths = sorted(part.iodepth.unique())
    colours = dict(zip(depths, sns.color_palette("viridis_r", len(depths)), strict=True))
    styles = {"read": ("-", "o"), "write": ("--", "s")}
    for (direction, depth), rows in part.groupby(["direction", "iodepth"], sort=True):
        line, marker = styles.get(str(direction), ("-", "o"))
        ax.plot(rows.x, rows.norm_throughput, line, marker=marker, color=colours[depth],
                linewidth=2.5, markersize=7)
    ax.set_xscale("log", base=2)
    ticks = sorted(part.x.unique())
    ax.set_xticks(ticks, [_short_size(t) for t in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    blank = Line2D([], [], linestyle="none")
    depth_keys = [Line2D([], [], color=colours[d], linewidth=3) for d in depths]
    rw_keys = [Line2D([], [], color="0.3", linestyle=line, marker=marker, linewidth=2)
               for line, marker in styles.values()]
    ncol = max(len(depths), len(rw_keys))
    # matplotlib fills legend columns first: pair each depth with a read/write key (or a
    # blank), so the first row lists the depths and the second read and write
    handles, labels = [], []
    for i in range(ncol):
        handles += [depth_keys[i] if i < len(depths) else blank,
                    rw_keys[i] if i < len(rw_keys) else blank]
        labels += [f"iodepth {depths[i]}" if i < len(depths) else "",
                   list(styles)[i] if i < len(rw_keys) else ""]
    ax.legend(handles, labels, ncol=ncol, fontsize=14, loc="upper center",
              bbox_to_anchor=(0.5, -0.2), frameon=False, handlelength=2.5)


def _b5_streams(ax: plt.Axes, df: pd.DataFrame) -> None:
    """Read throughput vs parallel streams at the base size and depth: more jobs on one
    target, more targets with one job each. A way measured at one value only shows its one
    point and says so in the legend."""
    for panel, what, marker, colour in B5_STREAMS:
        rows = df[df.panel == panel].sort_values("x")
        if not len(rows):
            continue
        label = what if rows.x.nunique() > 1 else f"{what}: only {rows.x.iloc[0]} measured"
        ax.plot(rows.x, rows.norm_throughput, "-", marker=marker, color=colour, linewidth=2.5,
                markersize=11 if panel == "targets" else 7, label=label,
                markerfacecolor="none" if panel == "targets" else colour, markeredgewidth=2)
    counts = sorted(df[df.panel.isin([p for p, *_ in B5_STREAMS])].x.unique())
    ax.set_xticks(counts)
    if len(counts) == 1:
        ax.set_xlim(counts[0] - 1, counts[0] + 1)
    ax.legend(fontsize=14, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)


def b5_ssd_parallelism(df: pd.DataFrame) -> plt.Figure:
    """Normalized throughput vs request size x I/O depth (left), and read throughput vs
    parallel streams, jobs or targets, at the base request size and depth (right)."""
    require_columns(df, ["panel", "x", "iodepth", "norm_throughput", "bw_bytes_s",
                         "direction"], "B5")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.8), sharey=True,
                                      layout="constrained", gridspec_kw={"width_ratios": [2, 1]})
    _b5_request_size(left, df[df.panel == "request size"])
    left.set(xlabel="request size (K = KiB, M = MiB)", ylabel="throughput / best measured (x)",
             title="request size x I/O depth (1 job, 1 target)", ylim=(0, 1.08))
    _b5_streams(right, df)
    base = df.base.iloc[0] if "base" in df.columns and len(df) else ""
    right.set(xlabel="parallel streams", title=f"read, {base}" if base else "read")
    best = df.groupby("direction").bw_bytes_s.max()
    scale = ", ".join(f"{d} {v / 1e9:.2f} GB/s" for d, v in best.items())
    fig.suptitle(f"B5  SSD parallelism, measured with fio (1.0 = {scale})", fontsize=18,
                 fontweight="bold")
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
    here); each panel has its own y scale, since a slow drive can be many times MEM. Each tier's
    bar for the longest prompt carries its value; one legend for both panels.
    """
    require_columns(df, ["drives", "tier", "label", "prompt_tokens", "norm_ttft"], "B6")
    sources = list(dict.fromkeys(df.drives))
    fig, axes = plt.subplots(1, len(sources), figsize=(6.5 * len(sources), 5.5),
                             squeeze=False, layout="constrained")
    handles: dict[str, object] = {}
    for ax, source in zip(axes[0], sources, strict=True):
        part = df[(df.drives == source) & (df.tier != "mem")]
        labels = list(dict.fromkeys(part.label))
        lengths = sorted(part.prompt_tokens.unique())
        width = 0.8 / len(lengths)
        tallest = part.groupby("label", sort=False).norm_ttft.max().loc[labels]
        for i, tokens in enumerate(lengths):
            rows = part[part.prompt_tokens == tokens].set_index("label").loc[labels]
            x = np.arange(len(labels)) + (i - (len(lengths) - 1) / 2) * width
            handles[f"{tokens // 1024}K"] = ax.bar(x, rows.norm_ttft, width * 0.95)
            if tokens == lengths[-1]:  # the longest prompt: the value above its group
                for xi, value, top in zip(x, rows.norm_ttft, tallest, strict=True):
                    ax.annotate(f"{value:.2f}", (xi, top), xytext=(0, 3),
                                textcoords="offset points", ha="center", va="bottom",
                                fontsize=13)
        handles["MEM (1.0)"] = ax.axhline(1.0, color="0.2", linestyle="--", linewidth=1.2)
        ax.set_xticks(np.arange(len(labels)), labels)
        ax.set_ylim(0, float(part.norm_ttft.max()) * 1.15)
        ax.set(title=f"drives: {source}", ylabel="TTFT / MEM TTFT (x)")
    fig.suptitle("B6  Prompt caching on the simulator: study's drives vs measured drive",
                 fontsize=18, fontweight="bold")
    fig.legend(handles.values(), handles.keys(), loc="outside lower center",
               ncol=len(handles), fontsize=14, frameon=False,
               title=f"prompt tokens (number above each tier: its "
                     f"{int(df.prompt_tokens.max()) // 1024}K bar)",
               title_fontsize=14)
    return fig


__all__ = ["b10_io_queue_depth", "b5_ssd_parallelism", "b6_measured_vs_study",
           "b9_chunk_io_latency"]
