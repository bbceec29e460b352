"""KV working sets, write volumes and reuse statistics of block-hash traces (B2, B8)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from kvrepro.analysis import block_traces as blocks
from kvrepro.calc import endurance
from kvrepro.plots import block_trace_figures as bplots
from kvrepro.workload import synthetic_bailian as bailian
from kvrepro.workload.trace_replay import read_mooncake_trace, read_qwen_bailian_trace

MOONCAKE_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mooncake"
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
    """Requests with shared prefixes, equal timestamps and repeated ids, for cross-checks."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        k = int(rng.integers(1, 6))
        ids = tuple(int(h) for h in rng.integers(0, 15, k))
        rows.append((float(rng.integers(0, 40)) * 25.0, (k - 1) * 10 + int(rng.integers(1, 11)),
                     ids))
    return trace(rows)


# --------------------------------------------------------------------------- working set


def test_mooncake_working_set_fast_equals_reference(mooncake: pd.DataFrame) -> None:
    fast = blocks.working_set(mooncake, 512, QWEN3_14B_KV, ttl_s=600.0, grid_s=60.0)
    slow = blocks.working_set_reference(mooncake, 512, QWEN3_14B_KV, ttl_s=600.0, grid_s=60.0)
    pd.testing.assert_frame_equal(fast, slow)
    summary = blocks.working_set_summary(fast)
    # ~2.9 TB at 10 min, ~3.1 TB peak: far past B2's HBM + DRAM (465 GB for KV).
    assert 2000 < summary["ws_start_gb"] <= summary["ws_peak_gb"] < 5000
    assert len(fast) == 60 and fast.time_s.iloc[-1] >= mooncake.arrival_s.max()


def test_mooncake_full_blocks_reference_agrees_and_is_larger(mooncake: pd.DataFrame) -> None:
    full = blocks.working_set(mooncake, 512, QWEN3_14B_KV, ttl_s=600.0, grid_s=300.0,
                              partial_blocks="full")
    slow = blocks.working_set_reference(mooncake, 512, QWEN3_14B_KV, ttl_s=600.0,
                                        grid_s=300.0, partial_blocks="full")
    actual = blocks.working_set(mooncake, 512, QWEN3_14B_KV, ttl_s=600.0, grid_s=300.0)
    pd.testing.assert_frame_equal(full, slow)
    assert (full.ws_bytes >= actual.ws_bytes).all() and (full.ws_bytes > actual.ws_bytes).any()


def test_small_working_set_by_hand(small: pd.DataFrame) -> None:
    ws = blocks.working_set(small, 10, 1, ttl_s=600.0, grid_s=100.0)
    assert ws.time_s.tolist() == [0, 100, 200, 300, 400, 500, 600, 700]
    # Live iff u <= t < u + TTL: r0 leaves at exactly 600 s, r1 at exactly 700 s.
    assert ws.ws_bytes.tolist() == [20, 25, 25, 25, 25, 25, 15, 30]
    assert ws.live_blocks.tolist() == [2, 3, 3, 3, 3, 3, 2, 3]
    full = blocks.working_set(small, 10, 1, ttl_s=600.0, grid_s=100.0, partial_blocks="full")
    assert full.ws_bytes.tolist() == [20, 30, 30, 30, 30, 30, 20, 30]
    summary = blocks.working_set_summary(ws)
    assert summary == {"ws_start_gb": 15e-9, "start_time_min": 10.0, "ws_peak_gb": 30e-9,
                       "peak_time_min": 700 / 60}


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("partial", ["actual", "full"])
def test_random_working_set_fast_equals_reference(seed: int, partial: str) -> None:
    df = random_trace(seed)
    ttl = float(np.random.default_rng(seed).choice([25.0, 60.0, 137.5, 300.0]))
    kwargs = dict(ttl_s=ttl, grid_s=12.5, partial_blocks=partial)
    pd.testing.assert_frame_equal(blocks.working_set(df, 10, 3, **kwargs),
                                  blocks.working_set_reference(df, 10, 3, **kwargs))


def test_block_uses_rejects_inconsistent_lengths() -> None:
    with pytest.raises(ValueError, match="does not fit 2 blocks of 10"):
        blocks.block_uses(trace([(0.0, 25, (1, 2))]), 10, 1)
    with pytest.raises(ValueError, match="partial_blocks"):
        blocks.block_uses(trace([(0.0, 5, (1,))]), 10, 1, partial_blocks="half")  # type: ignore


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
    never = blocks.write_volume(small, 10, 1, ttl_s=None, bin_s=600.0)
    assert never.write_bytes.tolist() == [25, 10]  # blocks 1, 2, 3 (5 tokens); then 4
    assert never.rewrite_bytes.sum() == 0
    ttl = blocks.write_volume(small, 10, 1, ttl_s=600.0, bin_s=600.0)
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
    ratios = blocks.hit_ratio_by_ttl(small, [600.0, 700.0, 701.0], 10, 1)
    # 7 uses; 600 s: only r1's block 1 hits; 700 s: r2's block 1 too (700 < 100 + 700);
    # 701 s: r2's block 2 too (700 < 0 + 701).
    assert (ratios.hit_ratio * 7).round().tolist() == [1, 2, 3]
    assert (ratios.byte_hit_ratio * 65).round().tolist() == [10, 20, 30]


def test_stack_distances_by_hand(small: pd.DataFrame) -> None:
    distance = blocks.stack_distances(small, 10, 1)
    # r1 block 1: r0's blocks 1 and 2 share a recency (20 B); r2 block 1: r1's blocks 1, 3
    # (15 B); r2 block 2: everything since r0 (10 B of block 2 left there + 15 B of r1).
    assert distance.tolist() == [np.inf, np.inf, 20, np.inf, 15, 25, np.inf]
    ratios = blocks.hit_ratio_by_capacity(small, [14, 15, 20, 25, 1e9], 10, 1)
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
    dist = blocks.reuse_time_distribution(small, (0.5, 1.0), 10, 1)
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


# --------------------------------------------------------------------------- figures


def test_figures_return_figures(small: pd.DataFrame) -> None:
    ws = blocks.working_set(small, 10, 1e9, ttl_s=600.0, grid_s=100.0)
    fig = bplots.b2_working_set(blocks.tiered_working_set(ws, 10e9, 10e9, 5e9),
                                {"HBM": 10, "HBM+DRAM": 20}, warmup_min=10)
    assert isinstance(fig, plt.Figure) and fig.axes[0].get_title().startswith("B2")
    volume = blocks.write_volume(small, 10, 1e9, ttl_s=600.0, bin_s=600.0).assign(trace="t")
    assert isinstance(bplots.kv_write_volume(volume, reference_tb_per_day=57.5), plt.Figure)
    by_ttl = blocks.hit_ratio_by_ttl(small, [60, 600], 10, 1).assign(trace="t")
    by_cap = blocks.hit_ratio_by_capacity(small, [10, 100], 10, 1).assign(trace="t")
    assert len(bplots.reuse_hit_ratio(by_ttl, by_cap).axes) == 2
    with pytest.raises(ValueError, match="figure B2: data lacks column"):
        bplots.b2_working_set(ws)
