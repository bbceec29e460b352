"""KV working sets, write volumes and reuse statistics of block-hash request traces (B2, B8).

Study B's figure B2 asks how much KV a server must keep to honour a prompt-cache TTL: the
*working set* at time t is the KV of every distinct block used in the last TTL. Whatever does
not fit into HBM and DRAM lands on SSD. Figure B8 turns the KV a tier must absorb per day into
a minimum SSD capacity for endurance. Block-hash traces (Mooncake, Qwen-Bailian) are exactly
the input both need: each request lists the hash ids of its prompt's fixed-size token blocks,
and equal ids are equal KV.

Conventions (the same in every function here, so their results agree with each other):

* A block is *used* by every request whose `hash_ids` contain it, at the request's arrival.
  Requests are taken in arrival order (stable for equal times); a hash id repeated inside one
  request counts once, at its first position.
* Bytes of a block = its tokens x KV bytes per token. A prompt's last block is *partial* when
  input_length is not a multiple of the block size. What it counts for is the one parameter
  `partial_blocks` (`PARTIAL_BLOCK_RULES`, applied in `block_token_counts` and nowhere else):
  `"full_only"` (the default, `DEFAULT_PARTIAL_BLOCKS`) drops it, as a KV store does (vLLM's
  prefix cache keeps full blocks only; LMCache 0.5 defaults to `save_unfull_chunk=False`);
  `"whole"` counts it as a full block; `"actual"` counts its real tokens
  input_length - (n_blocks - 1) x block_tokens, the KV the prompt produces. On the Mooncake
  conversation trace (512-token blocks, Qwen3-14B) the 10-minute-TTL peak is ~3,014 /
  3,200 / 3,111 GB under the three rules. A hash id seen with different token counts keeps
  the largest (in real traces a partial block's id never recurs as a full block, so this
  does not happen there).
* A block used at time u is *live* for t in [u, u + TTL): the working set at t holds it iff
  some use u satisfies u <= t < u + TTL (that is, t - TTL < u <= t). A use *hits* under a TTL
  iff the block's previous use u' satisfies t < u' + TTL; otherwise it *writes* (first use,
  or a rewrite after the TTL evicted the block). So written bytes = used bytes x (1 - byte hit
  ratio) for the same TTL.
* Only prompt blocks are counted: a request's output KV enters the trace as the next turn's
  prompt blocks (at that turn's arrival); the output of a conversation's last turn is not.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from kvrepro._checks import non_negative, positive
from kvrepro.calc import endurance
from kvrepro.calc.endurance import SECONDS_PER_DAY
from kvrepro.workload.trace_replay import ReadResult

PartialBlocks = Literal["full_only", "whole", "actual"]
PARTIAL_BLOCK_RULES: dict[str, str] = {
    "full_only": "full blocks only",
    "whole": "partial last block counted whole",
    "actual": "partial last block at its tokens",
}
"""What each `partial_blocks` rule counts, as figures and headlines label it."""
DEFAULT_PARTIAL_BLOCKS: PartialBlocks = "full_only"
"""What a KV store holds: vLLM caches full blocks only, LMCache 0.5 by default too."""
GB = 1e9
TB = 1e12

# B2's server (NVIDIA B200 per GPU, as study B labels it): "HBM 140 GB (Model Size: 50 GB)".
# We read that as 140 GB of HBM of which the model takes 50 GB, leaving 90 GB for KV. (If the
# 140 GB were meant as KV space, only the HBM/DRAM boundary moves, by 50 GB.)
B2_HBM_BYTES = 140e9
B2_MODEL_BYTES = 50e9
B2_HBM_KV_BYTES = B2_HBM_BYTES - B2_MODEL_BYTES
B2_DRAM_BYTES = 375e9
B2_SSD_BYTES = 1e12
"""The low end of B2's "SSD 1-10 TB": the smallest SSD tier, where overflow shows first."""
TIERS = ("HBM", "DRAM", "SSD", "overflow")


# --------------------------------------------------------------------------- block uses


@dataclass(frozen=True)
class BlockUses:
    """Every (request, block) use of a trace, flattened, in arrival order.

    Arrays are per use, sorted by (arrival, request, position). `prev`/`next` index the same
    block's previous/next use (-1 / n when none), so TTL and LRU questions become array
    arithmetic instead of dictionary walks. `first_arrival_s`/`last_arrival_s` span all
    requests (also those whose blocks the rule dropped), so every rule gets the same time
    grid; `partial_blocks` is the rule the sizes were made with.
    """

    time_s: np.ndarray
    request: np.ndarray
    block: np.ndarray
    use_bytes: np.ndarray
    prev: np.ndarray
    next: np.ndarray
    block_bytes: np.ndarray
    n_requests: int
    first_arrival_s: float
    last_arrival_s: float
    partial_blocks: PartialBlocks

    def __len__(self) -> int:
        return len(self.time_s)

    @property
    def prev_time_s(self) -> np.ndarray:
        """Time of the block's previous use, -inf for a first use."""
        out = np.full(len(self), -np.inf)
        has = self.prev >= 0
        out[has] = self.time_s[self.prev[has]]
        return out


TraceInput = pd.DataFrame | ReadResult | BlockUses


def partial_blocks_label(partial_blocks: PartialBlocks | None = None) -> str:
    """The working-set definition in words, for figure titles and headline sources."""
    return PARTIAL_BLOCK_RULES[_rule(partial_blocks)]


def _rule(partial_blocks: PartialBlocks | None) -> PartialBlocks:
    rule = DEFAULT_PARTIAL_BLOCKS if partial_blocks is None else partial_blocks
    if rule not in PARTIAL_BLOCK_RULES:
        raise ValueError(f"parameter 'partial_blocks' must be one of "
                         f"{list(PARTIAL_BLOCK_RULES)}, got {partial_blocks!r}")
    return rule


def block_token_counts(input_length: np.ndarray, n_blocks: np.ndarray, block_tokens: int,
                       partial_blocks: PartialBlocks | None = None,
                       request_ids: np.ndarray | None = None) -> np.ndarray:
    """Tokens each listed block counts for, per request's blocks concatenated; 0 = dropped.

    The single place the partial-block rule lives (see `PARTIAL_BLOCK_RULES`): every block
    but a request's last is full; the last holds input_length - (n_blocks - 1) x block_tokens
    tokens and is partial when that is below `block_tokens`. `"full_only"` drops a partial
    block (0), `"whole"` counts it as `block_tokens`, `"actual"` at its tokens. An error
    names the first request (its entry of `request_ids`, else its index) whose input_length
    does not fit its blocks.
    """
    rule = _rule(partial_blocks)
    last_tokens = input_length - (n_blocks - 1) * block_tokens
    bad = np.flatnonzero((n_blocks <= 0) | (last_tokens <= 0) | (last_tokens > block_tokens))
    if len(bad):
        name = int(bad[0] if request_ids is None else request_ids[bad[0]])
        raise ValueError(f"request {name}: input_length "
                         f"{int(input_length[bad[0]])} does not fit {int(n_blocks[bad[0]])} "
                         f"blocks of {block_tokens} tokens")
    tokens = np.full(int(n_blocks.sum()), block_tokens, dtype=np.int64)
    last = np.cumsum(n_blocks) - 1
    if rule == "actual":
        tokens[last] = last_tokens
    elif rule == "full_only":
        tokens[last] = np.where(last_tokens == block_tokens, block_tokens, 0)
    return tokens


def _flatten(df: pd.DataFrame, block_tokens: int,
             partial_blocks: PartialBlocks) -> tuple[np.ndarray, ...]:
    """Per-use arrival, request index, hash id and token count (requests in arrival order),
    without the blocks the partial-block rule drops."""
    order = np.argsort(df["arrival_s"].to_numpy(dtype="float64"), kind="stable")
    arrival = df["arrival_s"].to_numpy(dtype="float64")[order]
    hashes = df["hash_ids"].to_numpy()[order]
    lengths = np.fromiter((len(h) for h in hashes), dtype=np.int64, count=len(hashes))
    if (lengths == 0).any():
        raise ValueError(f"request {int(order[np.argmax(lengths == 0)])}: every request needs "
                         f"at least one hash id (column 'hash_ids')")
    flat = np.fromiter(itertools.chain.from_iterable(hashes), dtype=np.int64,
                       count=int(lengths.sum()))
    request = np.repeat(np.arange(len(hashes), dtype=np.int64), lengths)
    tokens = block_token_counts(df["input_length"].to_numpy(dtype="int64")[order], lengths,
                                block_tokens, partial_blocks, request_ids=order)
    kept = tokens > 0
    return (np.repeat(arrival, lengths)[kept], request[kept], flat[kept], tokens[kept],
            arrival)


def _drop_repeats(request: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Mask keeping the first use of a block within each request (prefix traces never repeat)."""
    order = np.lexsort((np.arange(len(codes)), request, codes))
    same = (codes[order][1:] == codes[order][:-1]) & (request[order][1:] == request[order][:-1])
    keep = np.ones(len(codes), dtype=bool)
    keep[order[1:][same]] = False
    return keep


def _links(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Previous/next use of the same block, and the sort order grouping uses by block."""
    n = len(codes)
    order = np.lexsort((np.arange(n), codes))
    same = codes[order][1:] == codes[order][:-1]
    prev = np.full(n, -1, dtype=np.int64)
    nxt = np.full(n, n, dtype=np.int64)
    prev[order[1:][same]] = order[:-1][same]
    nxt[order[:-1][same]] = order[1:][same]
    return prev, nxt, order


def block_uses(df: TraceInput, block_tokens: int | None = None,
               kv_bytes_per_token: int | None = None,
               partial_blocks: PartialBlocks | None = None) -> BlockUses:
    """Flatten a trace frame (`arrival_s`, `input_length`, `hash_ids`) into `BlockUses`.

    Done once per trace and reused by every statistic here (pass the result instead of the
    frame). `block_tokens` defaults to a `ReadResult`'s block size; `partial_blocks` (None:
    `DEFAULT_PARTIAL_BLOCKS`) is the partial-block rule, see `block_token_counts`. Passing
    `BlockUses` with a different rule than they were made with is an error.
    """
    if isinstance(df, BlockUses):
        if partial_blocks is not None and partial_blocks != df.partial_blocks:
            raise ValueError(f"parameter 'partial_blocks' = {partial_blocks!r}, but the block "
                             f"uses were made with {df.partial_blocks!r}")
        return df
    rule = _rule(partial_blocks)
    if isinstance(df, ReadResult):
        block_tokens = block_tokens or df.block_size
        df = df.frame
    if block_tokens is None or kv_bytes_per_token is None:
        raise ValueError("parameters 'block_tokens' and 'kv_bytes_per_token' are needed")
    positive(block_tokens=block_tokens, kv_bytes_per_token=kv_bytes_per_token)
    if len(df) == 0:
        raise ValueError("the trace has no requests")
    time_s, request, flat, tokens, arrival = _flatten(df, int(block_tokens), rule)
    _, codes = np.unique(flat, return_inverse=True)
    keep = _drop_repeats(request, codes)
    if not keep.all():
        time_s, request, codes, tokens = time_s[keep], request[keep], codes[keep], tokens[keep]
        _, codes = np.unique(codes, return_inverse=True)
    prev, nxt, order = _links(codes)
    starts = np.flatnonzero(np.r_[True, codes[order][1:] != codes[order][:-1]])
    block_tokens_max = (np.maximum.reduceat(tokens[order], starts) if len(order)
                        else np.zeros(0, dtype=np.int64))
    block_bytes = block_tokens_max.astype(np.int64) * int(kv_bytes_per_token)
    return BlockUses(time_s, request, codes.astype(np.int64), block_bytes[codes], prev, nxt,
                     block_bytes, len(df), float(arrival[0]), float(arrival[-1]), rule)


# --------------------------------------------------------------------------- working set


def time_grid(first_s: float, last_s: float, grid_s: float, start_s: float | None = None,
              end_s: float | None = None) -> np.ndarray:
    """Grid times from `start_s` (default: first arrival rounded down to the grid) to the first
    grid point at or after `end_s` (default: last arrival), so the trace's end is covered."""
    positive(grid_s=grid_s)
    start = math.floor(first_s / grid_s) * grid_s if start_s is None else float(start_s)
    end = last_s if end_s is None else float(end_s)
    n = max(math.ceil((end - start) / grid_s - 1e-9), 0) + 1
    return start + grid_s * np.arange(n, dtype="float64")


def _ws_frame(grid: np.ndarray, ws_bytes: np.ndarray, live_blocks: np.ndarray,
              ttl_s: float) -> pd.DataFrame:
    return pd.DataFrame({"time_s": grid, "time_min": grid / 60.0,
                         "ws_bytes": ws_bytes.astype(np.int64), "ws_gb": ws_bytes / GB,
                         "live_blocks": live_blocks.astype(np.int64), "ttl_s": float(ttl_s)})


def working_set(df: TraceInput, block_tokens: int | None = None,
                kv_bytes_per_token: int | None = None, ttl_s: float = 600.0,
                grid_s: float = 60.0, *, start_s: float | None = None, end_s: float | None = None,
                partial_blocks: PartialBlocks | None = None) -> pd.DataFrame:
    """KV bytes of distinct blocks live at each grid time under a TTL (figure B2).

    Each use u is live on [u, min(u + TTL, next use of the block)): cut at the next use, the
    intervals of one block are disjoint and their union is the block's live time, so the
    working set at t is a plain sum over uses, done as an event sweep with cumulative sums and
    binary search. Integer bytes keep it exactly equal to the by-definition loop of the tests.
    `partial_blocks` is the partial-block rule (`block_token_counts`; None: full blocks only,
    what a KV store holds). Columns: time_s, time_min, ws_bytes, ws_gb, live_blocks, ttl_s.
    """
    positive(ttl_s=ttl_s)
    uses = block_uses(df, block_tokens, kv_bytes_per_token, partial_blocks)
    grid = time_grid(uses.first_arrival_s, uses.last_arrival_s, grid_s, start_s, end_s)
    has_next = uses.next < len(uses)
    end = uses.time_s + ttl_s
    end[has_next] = np.minimum(end[has_next], uses.time_s[uses.next[has_next]])
    by_end = np.argsort(end, kind="stable")
    started = np.searchsorted(uses.time_s, grid, side="right")
    ended = np.searchsorted(end[by_end], grid, side="right")
    bytes_started = np.r_[0, np.cumsum(uses.use_bytes)]
    bytes_ended = np.r_[0, np.cumsum(uses.use_bytes[by_end])]
    ws_bytes = bytes_started[started] - bytes_ended[ended]
    return _ws_frame(grid, ws_bytes, started - ended, ttl_s)


def tier_split(ws_bytes: Sequence[float] | np.ndarray | float,
               hbm_bytes: float = B2_HBM_KV_BYTES, dram_bytes: float = B2_DRAM_BYTES,
               ssd_bytes: float = B2_SSD_BYTES) -> pd.DataFrame:
    """Where a working set lands: HBM first, then DRAM, then SSD; the rest is overflow.

    Columns hbm_bytes, dram_bytes, ssd_bytes, overflow_bytes (one row per working-set value);
    the defaults are B2's per-GPU KV capacities (see the module constants).
    """
    non_negative(hbm_bytes=hbm_bytes, dram_bytes=dram_bytes, ssd_bytes=ssd_bytes)
    ws = np.atleast_1d(np.asarray(ws_bytes, dtype="float64"))
    edges = np.cumsum([0.0, hbm_bytes, dram_bytes, ssd_bytes])
    parts = {f"{tier.lower()}_bytes": np.clip(ws - lo, 0.0, hi - lo)
             for tier, lo, hi in zip(TIERS[:3], edges[:-1], edges[1:], strict=True)}
    parts["overflow_bytes"] = np.maximum(ws - edges[-1], 0.0)
    return pd.DataFrame(parts)


def tiered_working_set(ws: pd.DataFrame, hbm_bytes: float = B2_HBM_KV_BYTES,
                       dram_bytes: float = B2_DRAM_BYTES,
                       ssd_bytes: float = B2_SSD_BYTES) -> pd.DataFrame:
    """Tidy (time_min, tier, gb) rows of a `working_set` frame, split by `tier_split`."""
    split = tier_split(ws["ws_bytes"].to_numpy(), hbm_bytes, dram_bytes, ssd_bytes)
    frames = [pd.DataFrame({"time_s": ws["time_s"].to_numpy(),
                            "time_min": ws["time_min"].to_numpy(), "tier": tier,
                            "gb": split[f"{tier.lower()}_bytes"].to_numpy() / GB})
              for tier in TIERS]
    return pd.concat(frames, ignore_index=True)


def working_set_summary(ws: pd.DataFrame, ttl_s: float | None = None) -> dict[str, float]:
    """B2's two numbers: the working set at the window start and its peak after it.

    The window starts one TTL after the grid's first time: before that the TTL window is not
    yet full of history, and the working set only ramps up from zero (a trace that starts
    empty, unlike the study's window cut from a running service).
    """
    ttl = float(ws["ttl_s"].iloc[0]) if ttl_s is None else float(ttl_s)
    window = ws[ws["time_s"] >= ws["time_s"].iloc[0] + ttl - 1e-9]
    if window.empty:
        raise ValueError(f"the trace ({ws['time_s'].iloc[-1] - ws['time_s'].iloc[0]:.0f} s) "
                         f"is shorter than one TTL ({ttl:.0f} s): no full window")
    peak = window.loc[window["ws_bytes"].idxmax()]
    return {"ws_start_gb": float(window["ws_gb"].iloc[0]),
            "start_time_min": float(window["time_min"].iloc[0]),
            "ws_peak_gb": float(peak["ws_gb"]), "peak_time_min": float(peak["time_min"])}


def working_set_by_rule(df: TraceInput, block_tokens: int | None = None,
                        kv_bytes_per_token: int | None = None, ttl_s: float = 600.0,
                        grid_s: float = 60.0) -> pd.DataFrame:
    """B2's two numbers under each partial-block rule, so the definition's weight is visible.

    One row per rule of `PARTIAL_BLOCK_RULES` (the default first): partial_blocks, definition,
    ws_start_gb, ws_peak_gb, peak_time_min, peak_vs_default_pct.
    """
    if isinstance(df, BlockUses):
        raise ValueError("working_set_by_rule needs the trace itself (a frame or ReadResult), "
                         "not BlockUses made with one rule")
    rules = [DEFAULT_PARTIAL_BLOCKS, *(r for r in PARTIAL_BLOCK_RULES
                                       if r != DEFAULT_PARTIAL_BLOCKS)]
    rows = []
    for rule in rules:
        ws = working_set(df, block_tokens, kv_bytes_per_token, ttl_s, grid_s,
                         partial_blocks=rule)
        summary = working_set_summary(ws)
        rows.append({"partial_blocks": rule, "definition": PARTIAL_BLOCK_RULES[rule],
                     "ws_start_gb": summary["ws_start_gb"], "ws_peak_gb": summary["ws_peak_gb"],
                     "peak_time_min": summary["peak_time_min"]})
    out = pd.DataFrame(rows)
    out["peak_vs_default_pct"] = (out["ws_peak_gb"] / out["ws_peak_gb"].iloc[0] - 1) * 100
    return out


# --------------------------------------------------------------------------- write volume


def _is_write(uses: BlockUses, ttl_s: float | None) -> np.ndarray:
    """Uses that create KV: first uses, and (with a TTL) uses after the TTL evicted the block."""
    first = uses.prev < 0
    if ttl_s is None:
        return first
    positive(ttl_s=ttl_s)
    return first | ~(uses.time_s < uses.prev_time_s + ttl_s)


def write_volume(df: TraceInput, block_tokens: int | None = None,
                 kv_bytes_per_token: int | None = None, ttl_s: float | None = None,
                 bin_s: float = 3600.0, *, start_s: float | None = None,
                 partial_blocks: PartialBlocks | None = None) -> pd.DataFrame:
    """KV bytes a write-through offload tier must absorb, per time bin (figure B8's input).

    A block is written when first seen and, with a TTL, again when it was evicted (its previous
    use lies a TTL or more back); without a TTL nothing is ever evicted. Columns: bin_start_s,
    bin_end_s, covered_s (the part of the bin between the first and last arrival, which rates
    are taken over), day, write_bytes, first_write_bytes, rewrite_bytes, used_bytes, writes,
    write_gb_per_hour, write_tb_per_day (both rates over covered_s).
    """
    positive(bin_s=bin_s)
    uses = block_uses(df, block_tokens, kv_bytes_per_token, partial_blocks)
    first_s, last_s = uses.first_arrival_s, uses.last_arrival_s
    if start_s is not None and start_s > first_s:
        raise ValueError(f"parameter 'start_s' = {start_s} lies after the first arrival "
                         f"({first_s} s): its writes would fall in no bin")
    edges = time_grid(first_s, last_s, bin_s, start_s)
    if edges[-1] <= last_s:
        edges = np.r_[edges, edges[-1] + bin_s]
    index = np.searchsorted(edges, uses.time_s, side="right") - 1
    write, first = _is_write(uses, ttl_s), uses.prev < 0
    n_bins = len(edges) - 1

    def per_bin(mask: np.ndarray) -> np.ndarray:
        return np.bincount(index[mask], weights=uses.use_bytes[mask], minlength=n_bins)

    covered = np.clip(np.minimum(edges[1:], last_s) - np.maximum(edges[:-1], first_s), 0, None)
    out = pd.DataFrame({
        "bin_start_s": edges[:-1], "bin_end_s": edges[1:], "covered_s": covered,
        "day": (edges[:-1] // SECONDS_PER_DAY).astype(np.int64),
        "write_bytes": per_bin(write), "first_write_bytes": per_bin(first),
        "rewrite_bytes": per_bin(write & ~first), "used_bytes": per_bin(np.ones_like(write)),
        "writes": np.bincount(index[write], minlength=n_bins)})
    with np.errstate(divide="ignore", invalid="ignore"):
        rate_bytes_s = np.where(covered > 0, out["write_bytes"] / covered, np.nan)
    out["write_gb_per_hour"] = rate_bytes_s * 3600.0 / GB
    out["write_tb_per_day"] = rate_bytes_s * SECONDS_PER_DAY / TB
    return out


def daily_write_volume(volume: pd.DataFrame) -> pd.DataFrame:
    """Per calendar day of trace time: bytes written, and the day's rate scaled to 24 h.

    A trace shorter than a day (Mooncake: 1 h) is extrapolated at its average rate over the
    covered span: `write_bytes_per_day` is what the tier would take if the load held all day.
    """
    days = volume.groupby("day", as_index=False)[
        ["write_bytes", "first_write_bytes", "rewrite_bytes", "covered_s"]].sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        days["write_bytes_per_day"] = np.where(
            days["covered_s"] > 0, days["write_bytes"] / days["covered_s"] * SECONDS_PER_DAY,
            np.nan)
    days["write_tb_per_day"] = days["write_bytes_per_day"] / TB
    return days


def endurance_from_writes(daily_write_bytes: float, drive_capacity_bytes: float,
                          n_drives: int = 1, raid_level: str | int = "RAID0",
                          presets: Sequence[str] | None = None) -> pd.DataFrame:
    """Link a daily KV write volume to endurance (B8) for one drive setup and NAND presets.

    Per NAND preset: its rated DWPD, C_bound (the smallest per-drive capacity that survives the
    volume), the DWPD the given drives would see, and whether they survive. Columns: preset,
    nand, feature, rated_dwpd, c_bound_tb, daily_writes_tb, drive_capacity_tb, n_drives,
    raid_level, dwpd_used, endurance_ok, years_to_rated_endurance.
    """
    positive(daily_write_bytes=daily_write_bytes)
    dwpd_used = endurance.dwpd_from_write_rate(daily_write_bytes / SECONDS_PER_DAY, n_drives,
                                               drive_capacity_bytes, raid_level)
    curves = endurance.c_bound_curves([daily_write_bytes / TB], presets, n_ssds=n_drives)
    return pd.DataFrame({
        "preset": curves["preset"], "nand": curves["nand"], "feature": curves["feature"],
        "rated_dwpd": curves["dwpd"], "c_bound_tb": curves["c_bound_tb"],
        "daily_writes_tb": daily_write_bytes / TB,
        "drive_capacity_tb": drive_capacity_bytes / TB, "n_drives": n_drives,
        "raid_level": endurance.normalize_raid_level(raid_level), "dwpd_used": dwpd_used,
        "endurance_ok": dwpd_used <= curves["dwpd"],
        "years_to_rated_endurance": [endurance.years_to_rated_endurance(dwpd_used, rated)
                                     for rated in curves["dwpd"]]})


# --------------------------------------------------------------------------- reuse statistics


def hit_ratio_by_ttl(df: TraceInput, ttls_s: Sequence[float], block_tokens: int | None = None,
                     kv_bytes_per_token: int | None = None,
                     partial_blocks: PartialBlocks | None = None) -> pd.DataFrame:
    """Fraction of block uses (and of their bytes) whose previous use lies within the TTL.

    First uses are misses (compulsory), so the ratio is what a TTL cache of unbounded size
    would serve. Columns: ttl_s, ttl_min, hit_ratio, byte_hit_ratio, uses.
    """
    uses = block_uses(df, block_tokens, kv_bytes_per_token, partial_blocks)
    prev_time, total_bytes = uses.prev_time_s, float(uses.use_bytes.sum())
    rows = []
    for ttl in ttls_s:
        positive(ttl_s=ttl)
        hit = uses.time_s < prev_time + ttl
        rows.append({"ttl_s": float(ttl), "ttl_min": ttl / 60.0, "hit_ratio": float(hit.mean()),
                     "byte_hit_ratio": float(uses.use_bytes[hit].sum() / total_bytes),
                     "uses": len(uses)})
    return pd.DataFrame(rows)


def reuse_summary(df: TraceInput, within_s: float = 600.0, block_tokens: int | None = None,
                  kv_bytes_per_token: int | None = None,
                  partial_blocks: PartialBlocks | None = None) -> dict[str, float]:
    """A trace's reuse in three numbers: the *ideal* hit ratio (share of block uses whose
    block was used before, i.e. an unbounded cache that never evicts), the same by bytes, and
    the share of reuses whose previous use lies within `within_s` (counted per reuse, as
    "80 % of reuses within 10 minutes" counts them). Keys: uses, ideal_hit_ratio,
    ideal_byte_hit_ratio, reuse_share_within, within_s."""
    positive(within_s=within_s)
    uses = block_uses(df, block_tokens, kv_bytes_per_token, partial_blocks)
    if len(uses) == 0:
        raise ValueError("the trace has no block uses under this partial-block rule")
    reuse = uses.prev >= 0
    gaps_s = uses.time_s[reuse] - uses.prev_time_s[reuse]
    return {"uses": float(len(uses)), "ideal_hit_ratio": float(reuse.mean()),
            "ideal_byte_hit_ratio": float(uses.use_bytes[reuse].sum() / uses.use_bytes.sum()),
            "reuse_share_within": float((gaps_s <= within_s).mean()) if reuse.any()
            else float("nan"), "within_s": float(within_s)}


def _fenwick_add(tree: list[int], slot: int, value: int) -> None:
    slot += 1
    while slot < len(tree):
        tree[slot] += value
        slot += slot & -slot


def _fenwick_prefix(tree: list[int], slot: int) -> int:
    """Sum of slots [0, slot)."""
    total = 0
    while slot > 0:
        total += tree[slot]
        slot -= slot & -slot
    return total


def stack_distances(df: TraceInput, block_tokens: int | None = None,
                    kv_bytes_per_token: int | None = None,
                    partial_blocks: PartialBlocks | None = None) -> np.ndarray:
    """Per use, the LRU stack distance in bytes: the block's own bytes plus the bytes of all
    other distinct blocks used since its previous use; inf for a first use.

    Request-granular LRU: a request's blocks are looked up together against the cache as it
    was before the request, and blocks last used by the same request share one recency (they
    are evicted together). A use hits an LRU of C bytes iff its distance <= C. A Fenwick tree
    over requests holds the bytes whose latest use is each request; uses are grouped into
    (request, previous request) pairs first, so the Python loop runs over a few pairs per
    request, not over blocks.
    """
    uses = block_uses(df, block_tokens, kv_bytes_per_token, partial_blocks)
    n_req = uses.n_requests
    reuse = np.flatnonzero(uses.prev >= 0)
    pair_key = uses.request[reuse] * n_req + uses.request[uses.prev[reuse]]
    pairs, inverse = np.unique(pair_key, return_inverse=True)
    pair_bytes = np.bincount(inverse, weights=uses.use_bytes[reuse]).astype(np.int64)
    request_bytes = np.bincount(uses.request, weights=uses.use_bytes,
                                minlength=n_req).astype(np.int64)
    pair_r, pair_q = (pairs // n_req).tolist(), (pairs % n_req).tolist()
    pair_b, request_b = pair_bytes.tolist(), request_bytes.tolist()
    tree = [0] * (n_req + 1)
    pair_distance = [0] * len(pairs)
    k = 0
    for r in range(n_req):
        first_k, below_r = k, _fenwick_prefix(tree, r)
        while k < len(pairs) and pair_r[k] == r:
            pair_distance[k] = below_r - _fenwick_prefix(tree, pair_q[k])
            k += 1
        for j in range(first_k, k):
            _fenwick_add(tree, pair_q[j], -pair_b[j])
        _fenwick_add(tree, r, request_b[r])
    distance = np.full(len(uses), np.inf)
    distance[reuse] = np.asarray(pair_distance, dtype="float64")[inverse]
    return distance


def hit_ratio_by_capacity(df: TraceInput, capacities_bytes: Sequence[float],
                          block_tokens: int | None = None, kv_bytes_per_token: int | None = None,
                          partial_blocks: PartialBlocks | None = None) -> pd.DataFrame:
    """Hit ratio of a (request-granular) LRU cache of each capacity, from stack distances.

    Columns: capacity_bytes, capacity_gb, hit_ratio, byte_hit_ratio, uses.
    """
    uses = block_uses(df, block_tokens, kv_bytes_per_token, partial_blocks)
    distance, total_bytes = stack_distances(uses), float(uses.use_bytes.sum())
    rows = []
    for capacity in capacities_bytes:
        non_negative(capacity_bytes=capacity)
        hit = distance <= capacity
        rows.append({"capacity_bytes": float(capacity), "capacity_gb": capacity / GB,
                     "hit_ratio": float(hit.mean()),
                     "byte_hit_ratio": float(uses.use_bytes[hit].sum() / total_bytes),
                     "uses": len(uses)})
    return pd.DataFrame(rows)


def reuse_times(df: TraceInput, block_tokens: int | None = None,
                kv_bytes_per_token: int | None = None,
                partial_blocks: PartialBlocks | None = None) -> pd.DataFrame:
    """One row per reuse (a use with a previous use): reuse_s (time since it) and bytes."""
    uses = block_uses(df, block_tokens, kv_bytes_per_token, partial_blocks)
    reuse = uses.prev >= 0
    return pd.DataFrame({"reuse_s": uses.time_s[reuse] - uses.prev_time_s[reuse],
                         "bytes": uses.use_bytes[reuse]})


def reuse_time_distribution(df: TraceInput, quantiles: Sequence[float] = (0.5, 0.9, 0.99),
                            block_tokens: int | None = None,
                            kv_bytes_per_token: int | None = None,
                            partial_blocks: PartialBlocks | None = None) -> pd.DataFrame:
    """Quantiles of the reuse time, by reuse count and weighted by bytes (how long a TTL must
    be to serve a given share of reuses). Columns: quantile, reuse_s, byte_weighted_reuse_s."""
    times = reuse_times(df, block_tokens, kv_bytes_per_token, partial_blocks)
    if times.empty:
        return pd.DataFrame({"quantile": list(quantiles), "reuse_s": np.nan,
                             "byte_weighted_reuse_s": np.nan})
    order = np.argsort(times["reuse_s"].to_numpy(), kind="stable")
    sorted_s = times["reuse_s"].to_numpy()[order]
    weight_cdf = np.cumsum(times["bytes"].to_numpy()[order]) / times["bytes"].sum()
    weighted = [float(sorted_s[min(np.searchsorted(weight_cdf, q), len(sorted_s) - 1)])
                for q in quantiles]
    return pd.DataFrame({"quantile": list(quantiles),
                         "reuse_s": np.quantile(sorted_s, list(quantiles)),
                         "byte_weighted_reuse_s": weighted})
