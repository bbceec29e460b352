"""KV working sets, write volumes and reuse statistics of block-hash traces (B2, B8)."""

from __future__ import annotations

import bisect
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from kvrepro.analysis import block_traces as blocks
from kvrepro.calc import endurance
from kvrepro.plots import block_trace_figures as bplots
from kvrepro.studies import synthetic_bailian as bailian
from kvrepro.workload.trace_replay import read_mooncake_trace, read_qwen_bailian_trace

MOONCAKE_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mooncake"
QWEN3_14B_KV = 163_840


def trace(rows: list[tuple[float, int, tuple[int, ...]]]) -> pd.DataFrame:
    """A minimal reader-style frame from (arrival_s, input_length, hash_ids) rows."""
    return pd.DataFrame({"arrival_s": [r[0] for r in rows], "input_length": [r[1] for r in rows],
                         "hash_ids": pd.Series([r[2] for r in rows], dtype=object)})


@pytest.fixture
def small() -> pd.DataFrame:
    """10-token blocks, 1 byte per token: r0 at 0 s uses blocks 1, 2 (full); r1 at 100 s uses
    1 and a 5-token partial block 3; r2 at 700 s uses 1, 2, 4."""
    return trace([(0.0, 20, (1, 2)), (100.0, 15, (1, 3)), (700.0, 30, (1, 2, 4))])


@pytest.fixture(scope="module")
def mooncake() -> pd.DataFrame:
    path = MOONCAKE_DIR / "conversation_trace.jsonl"
    if not path.is_file():
        pytest.skip(f"real Mooncake trace not found at {path} (shared data not mounted)")
    return read_mooncake_trace(path).frame


def random_trace(seed: int, n: int = 60) -> pd.DataFrame:
    """Requests with shared prefixes, equal timestamps and repeated ids, for cross-checks; half
    of them end in a block of their own (as real partial blocks do), the others in a shared id
    that may be full elsewhere (the largest-size convention)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        k = int(rng.integers(1, 6))
        ids = [int(h) for h in rng.integers(0, 15, k)]
        if rng.random() < 0.5:
            ids[-1] = 1000 + i
        rows.append((float(rng.integers(0, 40)) * 25.0, (k - 1) * 10 + int(rng.integers(1, 11)),
                     tuple(ids)))
    return trace(rows)


# --------------------------------------------------------------------------- working set


def kept_tokens(input_length: int, hashes: tuple[int, ...], block_tokens: int,
                rule: str) -> dict[int, int]:
    """Tokens a store keeps per block of one request, by the definitions, from token positions.

    Token position p of the prompt lies in block p // block_tokens; a block is full when all
    `block_tokens` positions fall into it. "full_only" keeps full blocks only, "whole" keeps
    every listed block at `block_tokens`, "actual" keeps each block at the positions in it.
    """
    positions = np.bincount(np.arange(input_length) // block_tokens).tolist()
    assert len(positions) == len(hashes), "input_length does not match the hash ids"
    kept: dict[int, int] = {}
    for block, n_positions in zip(hashes, positions, strict=True):
        tokens = {"full_only": n_positions if n_positions == block_tokens else 0,
                  "whole": block_tokens, "actual": n_positions}[rule]
        if tokens and block not in kept:
            kept[block] = tokens
    return kept


def working_set_by_definition(df: pd.DataFrame, block_tokens: int, kv_bytes_per_token: int,
                              ttl_s: float, grid_s: float, rule: str) -> pd.DataFrame:
    """The working set by the definition: at each grid time t, a dict of the blocks kept by
    requests with t - TTL < u <= t, each at the largest size the trace ever gives it."""
    rows = sorted(zip(df.arrival_s, df.input_length, df.hash_ids, strict=True),
                  key=lambda row: row[0])
    kept = [kept_tokens(n, tuple(h), block_tokens, rule) for _, n, h in rows]
    size: dict[int, int] = {}
    for blocks_of_request in kept:
        for block, tokens in blocks_of_request.items():
            size[block] = max(size.get(block, 0), tokens * kv_bytes_per_token)
    arrivals = [row[0] for row in rows]
    grid = blocks.time_grid(arrivals[0], arrivals[-1], grid_s)
    ws_bytes, live_blocks = [], []
    for t in grid:
        live: dict[int, int] = {}
        for i in range(bisect.bisect_right(arrivals, t - ttl_s), bisect.bisect_right(arrivals, t)):
            live.update({block: size[block] for block in kept[i]})
        ws_bytes.append(sum(live.values()))
        live_blocks.append(len(live))
    return pd.DataFrame({"time_s": grid, "time_min": grid / 60.0,
                         "ws_bytes": np.array(ws_bytes, dtype=np.int64),
                         "ws_gb": np.array(ws_bytes) / 1e9,
                         "live_blocks": np.array(live_blocks, dtype=np.int64),
                         "ttl_s": float(ttl_s)})


RULES = list(blocks.PARTIAL_BLOCK_RULES)


def test_default_rule_is_what_a_kv_store_holds() -> None:
    assert blocks.DEFAULT_PARTIAL_BLOCKS == "full_only"
    assert blocks.partial_blocks_label() == "full blocks only"
    assert set(RULES) == {"full_only", "whole", "actual"}


def test_block_token_counts_by_hand() -> None:
    # Three requests of 10-token blocks: 20 tokens (2 full), 15 (1 full + 5), 7 (a partial only).
    lengths, n_blocks = np.array([20, 15, 7]), np.array([2, 2, 1])
    expected = {"full_only": [10, 10, 10, 0, 0], "whole": [10, 10, 10, 10, 10],
                "actual": [10, 10, 10, 5, 7]}
    for rule, tokens in expected.items():
        assert blocks.block_token_counts(lengths, n_blocks, 10, rule).tolist() == tokens
    with pytest.raises(ValueError, match="request 7: input_length 25 does not fit 2 blocks"):
        blocks.block_token_counts(np.array([25]), np.array([2]), 10, "whole",
                                  request_ids=np.array([7]))


@pytest.mark.parametrize("rule", RULES)
def test_mooncake_working_set_fast_equals_definition(mooncake: pd.DataFrame, rule: str) -> None:
    grid_s = 60.0 if rule == blocks.DEFAULT_PARTIAL_BLOCKS else 300.0
    fast = blocks.working_set(mooncake, 512, QWEN3_14B_KV, ttl_s=600.0, grid_s=grid_s,
                              partial_blocks=rule)
    slow = working_set_by_definition(mooncake, 512, QWEN3_14B_KV, 600.0, grid_s, rule)
    pd.testing.assert_frame_equal(fast, slow)
    summary = blocks.working_set_summary(fast)
    # Terabytes at 10 min and at the peak: far past B2's HBM + DRAM (465 GB for KV).
    assert 2000 < summary["ws_start_gb"] <= summary["ws_peak_gb"] < 5000
    assert fast.time_s.iloc[-1] >= mooncake.arrival_s.max()


def test_mooncake_rules_order_full_only_below_actual_below_whole(mooncake: pd.DataFrame) -> None:
    table = blocks.working_set_by_rule(mooncake, 512, QWEN3_14B_KV, ttl_s=600.0, grid_s=60.0)
    peak = table.set_index("partial_blocks").ws_peak_gb
    assert table.partial_blocks.iloc[0] == blocks.DEFAULT_PARTIAL_BLOCKS
    assert table.peak_vs_default_pct.iloc[0] == 0
    assert peak["full_only"] < peak["actual"] < peak["whole"]
    # Dropping partial blocks takes off at most one block per live request: a few per cent.
    assert 0 < 1 - peak["full_only"] / peak["whole"] < 0.1


def test_small_working_set_by_hand(small: pd.DataFrame) -> None:
    # Live iff u <= t < u + TTL: r0 leaves at exactly 600 s, r1 at exactly 700 s. r1's block 3
    # holds 5 of 10 tokens: dropped, counted whole, or counted at its 5 tokens.
    expected = {"full_only": ([20, 20, 20, 20, 20, 20, 10, 30], [2, 2, 2, 2, 2, 2, 1, 3]),
                "whole": ([20, 30, 30, 30, 30, 30, 20, 30], [2, 3, 3, 3, 3, 3, 2, 3]),
                "actual": ([20, 25, 25, 25, 25, 25, 15, 30], [2, 3, 3, 3, 3, 3, 2, 3])}
    for rule, (ws_bytes, live) in expected.items():
        ws = blocks.working_set(small, 10, 1, ttl_s=600.0, grid_s=100.0, partial_blocks=rule)
        assert ws.time_s.tolist() == [0, 100, 200, 300, 400, 500, 600, 700]
        assert ws.ws_bytes.tolist() == ws_bytes and ws.live_blocks.tolist() == live, rule
        pd.testing.assert_frame_equal(
            ws, working_set_by_definition(small, 10, 1, 600.0, 100.0, rule))
    summary = blocks.working_set_summary(blocks.working_set(small, 10, 1, ttl_s=600.0,
                                                            grid_s=100.0))
    assert summary == {"ws_start_gb": 10e-9, "start_time_min": 10.0, "ws_peak_gb": 30e-9,
                       "peak_time_min": 700 / 60}
    by_rule = blocks.working_set_by_rule(small, 10, 1, ttl_s=600.0, grid_s=100.0)
    assert dict(zip(by_rule.partial_blocks, by_rule.ws_start_gb * 1e9, strict=True)) \
        == pytest.approx({"full_only": 10, "whole": 20, "actual": 15})


def test_partial_only_request_keeps_the_time_grid() -> None:
    # r1 is a single 7-token partial block: under full_only it holds no KV but still spans time.
    df = trace([(0.0, 20, (1, 2)), (250.0, 7, (9,))])
    full_only = blocks.working_set(df, 10, 1, ttl_s=600.0, grid_s=100.0)
    actual = blocks.working_set(df, 10, 1, ttl_s=600.0, grid_s=100.0, partial_blocks="actual")
    assert full_only.time_s.tolist() == actual.time_s.tolist() == [0, 100, 200, 300]
    assert full_only.ws_bytes.tolist() == [20, 20, 20, 20]
    assert actual.ws_bytes.tolist() == [20, 20, 20, 27]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("rule", RULES)
def test_random_working_set_fast_equals_definition(seed: int, rule: str) -> None:
    df = random_trace(seed)
    ttl = float(np.random.default_rng(seed).choice([25.0, 60.0, 137.5, 300.0]))
    fast = blocks.working_set(df, 10, 3, ttl_s=ttl, grid_s=12.5, partial_blocks=rule)
    pd.testing.assert_frame_equal(fast, working_set_by_definition(df, 10, 3, ttl, 12.5, rule))


def test_block_uses_rejects_inconsistent_input() -> None:
    with pytest.raises(ValueError, match="request 0: input_length 25 does not fit 2 blocks"):
        blocks.block_uses(trace([(0.0, 25, (1, 2))]), 10, 1)
    with pytest.raises(ValueError, match="partial_blocks"):
        blocks.block_uses(trace([(0.0, 5, (1,))]), 10, 1, partial_blocks="half")  # type: ignore
    uses = blocks.block_uses(trace([(0.0, 5, (1,))]), 10, 1, partial_blocks="whole")
    assert blocks.block_uses(uses, partial_blocks="whole") is uses
    with pytest.raises(ValueError, match="made with 'whole'"):
        blocks.working_set(uses, partial_blocks="full_only")


def test_tier_split_fills_hbm_then_dram_then_ssd() -> None:
    split = blocks.tier_split([0, 50e9, 200e9, 781e9, 2000e9])
    assert blocks.B2_HBM_KV_BYTES == 90e9
    assert split.hbm_bytes.tolist() == [0, 50e9, 90e9, 90e9, 90e9]
    assert split.dram_bytes.tolist() == [0, 0, 110e9, 375e9, 375e9]
    assert split.ssd_bytes.tolist() == [0, 0, 0, 316e9, 1000e9]
    assert split.overflow_bytes.tolist() == [0, 0, 0, 0, 535e9]
    assert np.allclose(split.sum(axis=1), [0, 50e9, 200e9, 781e9, 2000e9])
    with pytest.raises(ValueError, match="dram_bytes"):
        blocks.tier_split(1.0, dram_bytes=-1)


def test_tiered_working_set_is_tidy(small: pd.DataFrame) -> None:
    ws = blocks.working_set(small, 10, 1e9, ttl_s=600.0, grid_s=100.0)
    tidy = blocks.tiered_working_set(ws, hbm_bytes=10e9, dram_bytes=10e9, ssd_bytes=5e9)
    assert list(tidy.tier.unique()) == list(blocks.TIERS)
    at_700 = tidy[tidy.time_s == 700].set_index("tier").gb
    assert at_700.to_dict() == {"HBM": 10, "DRAM": 10, "SSD": 5, "overflow": 5}


# --------------------------------------------------------------------------- write volume


def test_write_volume_first_writes_and_rewrites(small: pd.DataFrame) -> None:
    never = blocks.write_volume(small, 10, 1, ttl_s=None, bin_s=600.0, partial_blocks="actual")
    assert never.write_bytes.tolist() == [25, 10]  # blocks 1, 2, 3 (5 tokens); then 4
    assert never.rewrite_bytes.sum() == 0
    ttl = blocks.write_volume(small, 10, 1, ttl_s=600.0, bin_s=600.0, partial_blocks="actual")
    # At 700 s block 1 (last used 100 s) and block 2 (0 s) are a TTL or more old: rewritten.
    assert ttl.write_bytes.tolist() == [25, 30]
    assert ttl.rewrite_bytes.tolist() == [0, 20]
    assert ttl.first_write_bytes.tolist() == [25, 10]
    assert ttl.used_bytes.tolist() == [35, 30]
    assert ttl.covered_s.tolist() == [600, 100]
    assert ttl.write_gb_per_hour.iloc[1] == pytest.approx(30 / 100 * 3600 / 1e9)
    day = blocks.daily_write_volume(ttl)
    assert day.write_bytes.tolist() == [55]
    assert day.write_bytes_per_day.iloc[0] == pytest.approx(55 / 700 * 86_400)


def test_write_volume_of_a_full_block_store(small: pd.DataFrame) -> None:
    # The default store never writes r1's partial block 3; the time span stays the trace's.
    ttl = blocks.write_volume(small, 10, 1, ttl_s=600.0, bin_s=600.0)
    assert ttl.write_bytes.tolist() == [20, 30] and ttl.rewrite_bytes.tolist() == [0, 20]
    assert ttl.used_bytes.tolist() == [30, 30] and ttl.covered_s.tolist() == [600, 100]
    whole = blocks.write_volume(small, 10, 1, ttl_s=600.0, bin_s=600.0, partial_blocks="whole")
    assert whole.write_bytes.tolist() == [30, 30]


def test_write_volume_equals_misses_of_the_same_ttl(mooncake: pd.DataFrame) -> None:
    uses = blocks.block_uses(mooncake, 512, QWEN3_14B_KV)
    written = blocks.write_volume(uses, ttl_s=600.0, bin_s=600.0).write_bytes.sum()
    hits = blocks.hit_ratio_by_ttl(uses, [600.0]).byte_hit_ratio.iloc[0]
    assert written == pytest.approx(uses.use_bytes.sum() * (1 - hits), rel=1e-12)
    first = blocks.write_volume(uses, bin_s=3600.0).write_bytes.sum()
    assert first == uses.block_bytes.sum()  # without a TTL every block is written once


def test_endurance_from_writes_links_to_endurance_module() -> None:
    table = blocks.endurance_from_writes(57.5e12, 7.68e12, n_drives=2, raid_level="RAID1")
    tlc = table.set_index("preset").loc["TLC"]
    assert tlc.c_bound_tb == pytest.approx(endurance.c_bound_bytes(57.5e12, tlc.rated_dwpd, 2)
                                           / 1e12)
    # RAID1 on 2 drives: each drive takes the full 57.5 TB per day.
    assert tlc.dwpd_used == pytest.approx(57.5 / 7.68)
    assert table.set_index("preset").endurance_ok.to_dict()["SLC"]
    assert not tlc.endurance_ok


# --------------------------------------------------------------------------- reuse


def test_hit_ratio_by_ttl_by_hand(small: pd.DataFrame) -> None:
    ratios = blocks.hit_ratio_by_ttl(small, [600.0, 700.0, 701.0], 10, 1, partial_blocks="actual")
    # 7 uses; 600 s: only r1's block 1 hits; 700 s: r2's block 1 too (700 < 100 + 700);
    # 701 s: r2's block 2 too (700 < 0 + 701).
    assert (ratios.hit_ratio * 7).round().tolist() == [1, 2, 3]
    assert (ratios.byte_hit_ratio * 65).round().tolist() == [10, 20, 30]
    # A full-block store never sees r1's partial block: 6 uses of 60 bytes.
    stored = blocks.hit_ratio_by_ttl(small, [600.0, 700.0, 701.0], 10, 1)
    assert (stored.hit_ratio * 6).round().tolist() == [1, 2, 3]
    assert (stored.byte_hit_ratio * 60).round().tolist() == [10, 20, 30]


def test_reuse_summary_by_hand(small: pd.DataFrame) -> None:
    # Reuses: r1 block 1 after 100 s, r2 block 1 after 600 s, r2 block 2 after 700 s.
    summary = blocks.reuse_summary(small, 600.0, 10, 1, partial_blocks="whole")
    assert summary["uses"] == 7 and summary["ideal_hit_ratio"] == pytest.approx(3 / 7)
    assert summary["reuse_share_within"] == pytest.approx(2 / 3)
    assert blocks.reuse_summary(small, 599.0, 10, 1)["reuse_share_within"] == pytest.approx(1 / 3)
    assert blocks.reuse_summary(small, 600.0, 10, 1)["ideal_hit_ratio"] == pytest.approx(3 / 6)


def test_stack_distances_by_hand(small: pd.DataFrame) -> None:
    distance = blocks.stack_distances(small, 10, 1, partial_blocks="actual")
    # r1 block 1: r0's blocks 1 and 2 share a recency (20 B); r2 block 1: r1's blocks 1, 3
    # (15 B); r2 block 2: everything since r0 (10 B of block 2 left there + 15 B of r1).
    assert distance.tolist() == [np.inf, np.inf, 20, np.inf, 15, 25, np.inf]
    ratios = blocks.hit_ratio_by_capacity(small, [14, 15, 20, 25, 1e9], 10, 1,
                                          partial_blocks="actual")
    assert (ratios.hit_ratio * 7).round().tolist() == [0, 1, 2, 3, 3]


def lru_distances_reference(df: pd.DataFrame, block_tokens: int) -> list[float]:
    """Request-granular LRU by the definition: bytes of blocks whose last request is at or
    after the block's own last request, looked up before the request updates the cache."""
    uses = blocks.block_uses(df, block_tokens, 1)
    size = dict(enumerate(uses.block_bytes.tolist()))
    last: dict[int, int] = {}
    out = []
    for r in range(uses.n_requests):
        mine = uses.block[uses.request == r].tolist()
        for b in mine:
            out.append(float(sum(size[c] for c, q in last.items() if q >= last[b]))
                       if b in last else np.inf)
        last.update(dict.fromkeys(mine, r))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_stack_distances_equal_plain_lru(seed: int) -> None:
    df = random_trace(seed, n=80)
    assert blocks.stack_distances(df, 10, 1).tolist() == lru_distances_reference(df, 10)


def test_lru_hit_ratio_grows_to_the_unbounded_ttl_ratio(mooncake: pd.DataFrame) -> None:
    uses = blocks.block_uses(mooncake, 512, QWEN3_14B_KV)
    lru = blocks.hit_ratio_by_capacity(uses, [1e11, 1e12, 1e15]).hit_ratio
    unbounded = blocks.hit_ratio_by_ttl(uses, [1e9]).hit_ratio.iloc[0]
    assert lru.is_monotonic_increasing and lru.iloc[-1] == pytest.approx(unbounded)


def test_reuse_times_by_hand(small: pd.DataFrame) -> None:
    times = blocks.reuse_times(small, 10, 1)
    assert times.reuse_s.tolist() == [100, 600, 700] and times.bytes.tolist() == [10, 10, 10]
    dist = blocks.reuse_time_distribution(small, (0.5, 1.0), 10, 1, partial_blocks="actual")
    assert dist.reuse_s.tolist() == [600, 700]
    assert dist.byte_weighted_reuse_s.tolist() == [600, 700]


# --------------------------------------------------------------------------- synthetic trace


def test_synthetic_bailian_is_deterministic_and_readable(tmp_path: Path) -> None:
    spec = bailian.BailianSpec(seed=3, duration_s=900.0, warmup_s=300.0, chat_rate_per_s=0.5)
    a = bailian.synthetic_bailian(tmp_path / "a.jsonl", spec)
    b = bailian.synthetic_bailian(tmp_path / "b.jsonl", spec)
    assert a.read_bytes() == b.read_bytes()
    other = bailian.synthetic_bailian_frame(bailian.BailianSpec(seed=4, duration_s=900.0))
    assert not other.equals(bailian.synthetic_bailian_frame(spec))
    frame = read_qwen_bailian_trace(a).frame  # strict: every line is valid
    assert frame.arrival_s.between(0, 900, inclusive="left").all()
    assert set(frame.request_type) <= set(bailian.BAILIAN_TYPES)
    assert frame.chat_id.is_unique and frame.arrival_s.is_monotonic_increasing


def test_synthetic_bailian_turns_share_their_parents_full_blocks() -> None:
    frame = bailian.synthetic_bailian_frame(bailian.BailianSpec(seed=1, duration_s=600.0))
    by_id = frame.set_index("chat_id")
    children = frame[frame.parent_chat_id.isin(by_id.index)]
    assert len(children) > 100
    for child in children.head(200).itertuples():
        parent = by_id.loc[child.parent_chat_id]
        n_full = parent.input_length // 16
        assert child.hash_ids[:n_full] == parent.hash_ids[:n_full]
        assert child.turn == parent.turn + 1 and child.timestamp > parent.timestamp
        if parent.input_length % 16:  # the parent's partial block is never reused as is
            assert parent.hash_ids[-1] not in child.hash_ids
    assert (frame.hash_ids.map(lambda ids: ids[:2]) == pd.Series([[0, 1]] * len(frame))).all()


def test_synthetic_bailian_working_set_is_hundreds_of_gb() -> None:
    frame = bailian.synthetic_bailian_frame(bailian.BailianSpec(seed=0, duration_s=1800.0))
    df = frame.rename(columns={"timestamp": "arrival_s"})
    summary = blocks.working_set_summary(blocks.working_set(df, 16, QWEN3_14B_KV, ttl_s=600.0))
    assert 100 < summary["ws_start_gb"] <= summary["ws_peak_gb"] < 1000


def test_stand_in_statistics_by_hand() -> None:
    # 16-token blocks; reuses: blocks 1 and 2 after 300 s, block 3 after 700 s (past 10 min).
    raw = pd.DataFrame({"timestamp": [0.0, 300.0, 1000.0], "input_length": [32, 48, 16],
                        "hash_ids": pd.Series([(1, 2), (1, 2, 3), (3,)], dtype=object)})
    table = bailian.stand_in_statistics(raw, name="tiny").set_index("statistic")
    assert table.tiny.to_dict() == pytest.approx({
        "requests": 3, "duration_h": 1000 / 3600, "block_tokens": 16,
        "ideal_hit_ratio": 3 / 6, "reuse_share_within_10_min": 2 / 3})
    assert table.published.to_dict() == {k: v.value for k, v in
                                         bailian.TRACE_A_PUBLISHED.items()}
    assert table.source.str.len().gt(0).all()


def test_stand_in_matches_trace_a_published_statistics() -> None:
    table = bailian.stand_in_statistics(bailian.synthetic_bailian_frame()).set_index("statistic")
    ours, published = table["stand-in"], table.published
    assert ours["requests"] == pytest.approx(published["requests"], rel=0.05)
    assert ours["duration_h"] == pytest.approx(published["duration_h"], rel=0.01)
    assert ours["block_tokens"] == published["block_tokens"] == 16
    assert ours["ideal_hit_ratio"] == pytest.approx(published["ideal_hit_ratio"], abs=0.02)
    assert ours["reuse_share_within_10_min"] == pytest.approx(
        published["reuse_share_within_10_min"], abs=0.03)


# --------------------------------------------------------------------------- figures


def test_figures_return_figures(small: pd.DataFrame) -> None:
    ws = blocks.working_set(small, 10, 1e9, ttl_s=600.0, grid_s=100.0)
    fig = bplots.b2_working_set(blocks.tiered_working_set(ws, 10e9, 10e9, 5e9),
                                {"HBM": 10, "HBM+DRAM": 20}, warmup_min=10)
    assert isinstance(fig, plt.Figure) and fig.axes[0].get_title().startswith("B2")
    labelled = bplots.b2_working_set(blocks.tiered_working_set(ws, 10e9, 10e9, 5e9),
                                     definition=blocks.partial_blocks_label(),
                                     trace_label="stand-in trace")
    assert labelled.axes[0].get_title().endswith("\nworking set: full blocks only")
    legend = [t.get_text() for t in labelled.axes[0].get_legend().get_texts()]
    assert "total, stand-in trace" in legend
    volume = blocks.write_volume(small, 10, 1e9, ttl_s=600.0, bin_s=600.0).assign(trace="t")
    assert isinstance(bplots.kv_write_volume(volume, reference_tb_per_day=57.5), plt.Figure)
    by_ttl = blocks.hit_ratio_by_ttl(small, [60, 600], 10, 1).assign(trace="t")
    by_cap = blocks.hit_ratio_by_capacity(small, [10, 100], 10, 1).assign(trace="t")
    assert len(bplots.reuse_hit_ratio(by_ttl, by_cap).axes) == 2
    with pytest.raises(ValueError, match="figure B2: data lacks column"):
        bplots.b2_working_set(ws)
