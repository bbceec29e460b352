"""Offload stores: LRU and TTL eviction, prefix lookup across stores, load and write timing."""

from __future__ import annotations

import math

import pytest

from kvrepro.engines.sim.config import SimTier
from kvrepro.engines.sim.offload import Channel, ChunkStore, OffloadHierarchy
from tests.engines.sim.conftest import CHUNK_BYTES, KV_BYTES, offload_tier


def test_lru_store_evicts_least_recently_used() -> None:
    store = ChunkStore(offload_tier(chunks=3), KV_BYTES)
    for cid in (1, 2, 3):
        assert store.insert(cid, 0.0, 0.0) == -1
    store.touch([1], 1.0)
    assert store.insert(4, 2.5, 2.0) == 2  # 1 was touched, so 2 is the oldest
    assert list(store.entries) == [3, 1, 4]
    assert store.evicted_chunks == 1 and store.first_eviction_s == 2.0


def test_ttl_store_expires_unused_chunks() -> None:
    store = ChunkStore(offload_tier(chunks=10, eviction="ttl", ttl_s=5.0), KV_BYTES)
    store.insert(1, 0.0, 0.0)
    store.insert(2, 3.0, 3.0)
    store.touch([1], 4.0)
    store.expire(8.5)  # 2 unused since 3.0 -> gone; 1 used at 4.0 -> kept
    assert list(store.entries) == [1]
    store.expire(9.0)
    assert not store.entries and store.expired_chunks == 2


def test_store_without_eviction_keeps_what_it_holds_and_counts_rejections() -> None:
    off = OffloadHierarchy(SimTier(stores=[offload_tier(chunks=3, eviction="none")]), KV_BYTES)
    off.write([1, 2], 0.0)
    off.write([3, 4, 5], 1.0)  # room for 3 only
    store = off.stores[0]
    assert list(store.entries) == [1, 2, 3]
    assert store.rejected_chunks == 2 and store.evicted_chunks == 0
    assert store.first_refusal_s == 1.0 and math.isnan(store.first_eviction_s)
    assert off.bytes_written[0] == 3 * CHUNK_BYTES  # rejected chunks cost no bandwidth
    off.touch([1, 2, 3], off.lookup([1, 2, 3], 10.0), 10.0)
    off.write([6], 11.0)
    assert list(store.entries) == [1, 2, 3] and store.rejected_chunks == 3
    assert store.first_refusal_s == 1.0  # the first refusal's time stays


def test_run_length_ignores_chunks_still_being_written() -> None:
    store = ChunkStore(offload_tier(chunks=10), KV_BYTES)
    store.insert(1, 0.0, 0.0)
    store.insert(2, 5.0, 5.0)
    assert store.run_length([1, 2, 3], 0, 1.0) == 1
    assert store.run_length([1, 2, 3], 0, 5.0) == 2


def test_channel_is_a_fifo_server() -> None:
    channel = Channel(bytes_per_s=1000.0, chunk_latency_s=0.5)
    assert channel.chunk_s(1000) == pytest.approx(1.5)
    assert channel.submit(0.0, 2, 1000) == pytest.approx(3.0)
    assert channel.backlog_s(1.0) == pytest.approx(2.0)
    assert channel.submit(1.0, 1, 1000) == pytest.approx(4.5)  # queued behind the first
    assert channel.submit(10.0, 1, 1000) == pytest.approx(11.5)  # idle channel


def _hierarchy(**tier: object) -> OffloadHierarchy:
    stores = tier.pop("stores", [offload_tier("staging", 2),
                                  offload_tier("flash", 100, read_bw_bytes_s=2e5,
                                               chunk_read_latency_s=0.01)])
    return OffloadHierarchy(SimTier(stores=stores, **tier), KV_BYTES)


def test_lookup_is_a_prefix_match_store_by_store() -> None:
    off = _hierarchy()
    staging, flash = off.stores
    for cid in (10, 11):
        staging.insert(cid, 0.0, 0.0)
    for cid in (10, 11, 12, 13, 15):
        flash.insert(cid, 0.0, 0.0)
    ids = [10, 11, 12, 13, 14, 15]
    assert off.lookup(ids, 1.0) == [2, 2]  # staging 10-11, flash continues 12-13, 14 missing
    assert off.lookup([12, 10], 1.0) == [0, 2]


def test_load_time_is_bytes_over_bandwidth_plus_chunk_latency() -> None:
    off = _hierarchy()
    for cid in range(5):
        off.stores[1].insert(cid, 0.0, 0.0)
    ids = list(range(5))
    counts = off.lookup(ids, 1.0)
    assert counts == [0, 5]
    done_s, per_store = off.load(ids, counts, 1, 5, 1.0)  # chunk 0 is a GPU hit
    assert per_store == [0, 4]
    assert done_s == pytest.approx(1.0 + 4 * CHUNK_BYTES / 2e5 + 4 * 0.01)
    assert off.bytes_read == [0, 4 * CHUNK_BYTES]
    # read chunks are staged in the faster store (2 chunks fit: the last two stay)
    assert list(off.stores[0].entries) == [3, 4]
    assert off.stores[0].entries[4] == pytest.approx(done_s)


def test_parallel_stores_and_queued_reads() -> None:
    off = _hierarchy()
    off.stores[0].insert(0, 0.0, 0.0)
    off.stores[1].insert(1, 0.0, 0.0)
    done_s, _ = off.load([0, 1], [1, 1], 0, 2, 0.0)
    flash_s = CHUNK_BYTES / 2e5 + 0.01
    assert done_s == pytest.approx(max(CHUNK_BYTES / 1e6, flash_s))
    again_s, _ = off.load([0, 1], [1, 1], 1, 2, 0.0)  # flash read queues behind the first
    assert again_s == pytest.approx(2 * flash_s)


def test_write_through_writes_every_store_and_skips_present_chunks() -> None:
    off = _hierarchy()
    off.stores[1].insert(7, 0.0, 0.0)
    off.write([7, 8], 0.0)
    assert off.bytes_written == [2 * CHUNK_BYTES, CHUNK_BYTES]
    assert off.stores[0].entries[8] == pytest.approx(2 * CHUNK_BYTES / 1e6)  # FIFO order
    assert off.stores[1].entries[8] == pytest.approx(CHUNK_BYTES / 1e6)


def test_writes_past_the_backlog_bound_are_dropped() -> None:
    store = offload_tier("dram", 100, write_bw_bytes_s=CHUNK_BYTES, max_write_backlog_s=2.0)
    off = _hierarchy(stores=[store])
    off.write(list(range(10)), 0.0)  # 1 s per chunk: chunks 0-2 start within 2 s
    assert len(off.stores[0].entries) == 3
    assert off.writes_dropped == [7]
    assert off.bytes_written == [3 * CHUNK_BYTES]


def test_write_back_demotes_evicted_chunks() -> None:
    off = _hierarchy(twin_write_back=True)
    off.write([1, 2, 3], 0.0)
    assert list(off.stores[0].entries) == [2, 3]
    assert list(off.stores[1].entries) == [1]


def test_zero_capacity_store_takes_nothing() -> None:
    off = _hierarchy(stores=[offload_tier("dram", 0)])
    off.write([1, 2], 0.0)
    assert not off.stores[0].entries and off.bytes_written == [0]
    assert off.lookup([1, 2], 1.0) == [0]
