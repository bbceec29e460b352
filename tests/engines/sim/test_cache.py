"""GPU prefix cache: hits, LRU eviction (tail first), pinning, commit accounting."""

from __future__ import annotations

import pytest

from kvrepro.engines.sim.cache import GpuPrefixCache
from kvrepro.engines.sim.prefix_units import OPEN


def _fill(cache: GpuPrefixCache, segment: int, blocks: int) -> None:
    """A request computes `blocks` full blocks of `segment` and finishes."""
    ranges = ((segment, 0, OPEN),)
    cache.pin([segment])
    assert cache.allocate(blocks)
    cache.commit(ranges, 0, blocks)
    cache.unpin([segment])


def _invariant(cache: GpuPrefixCache, private: int = 0) -> None:
    assert cache.used_blocks == sum(cache.cached.values()) + private
    assert cache.evictable_blocks == sum(k for s, k in cache.cached.items()
                                         if s not in cache.refs)
    assert 0 <= cache.used_blocks <= cache.capacity_blocks


def test_hit_is_the_leading_cached_run_across_segments() -> None:
    cache = GpuPrefixCache(100)
    _fill(cache, 1, 10)
    _fill(cache, 2, 5)
    ranges = ((1, 0, 10), (2, 10, OPEN))
    assert cache.hit_blocks(ranges, 50) == 15
    assert cache.hit_blocks(ranges, 12) == 12  # capped (the last token is always computed)
    assert cache.hit_blocks(((1, 0, 12), (2, 12, OPEN)), 50) == 10  # segment 1 falls short
    assert cache.hit_blocks(((3, 0, OPEN),), 50) == 0
    _invariant(cache)


def test_lru_evicts_least_recent_segment_from_its_tail() -> None:
    cache = GpuPrefixCache(30)
    _fill(cache, 1, 10)
    _fill(cache, 2, 10)
    _fill(cache, 3, 10)
    assert cache.allocate(4)  # evicts 4 blocks from segment 1's tail
    assert cache.cached[1] == 6 and cache.cached[2] == 10
    assert cache.evicted_blocks == 4
    cache.free(4)
    # touching segment 1 (pin + unpin) makes segment 2 the least recently used
    cache.pin([1])
    cache.unpin([1])
    assert cache.allocate(12)  # 4 free blocks, then 8 of segment 2's 10
    assert cache.cached == {1: 6, 2: 2, 3: 10}
    assert cache.allocate(2)
    assert 2 not in cache.cached and 2 not in cache.lru
    _invariant(cache, private=14)


def test_pinned_blocks_are_never_evicted() -> None:
    cache = GpuPrefixCache(20)
    _fill(cache, 1, 10)
    _fill(cache, 2, 10)
    cache.pin([1])
    assert cache.available_blocks() == 10
    assert not cache.allocate(11)
    assert cache.allocate(10)
    assert cache.cached == {1: 10}
    cache.unpin([1])
    _invariant(cache, private=10)


def test_available_blocks_excludes_segments_about_to_be_pinned() -> None:
    cache = GpuPrefixCache(20)
    _fill(cache, 1, 8)
    assert cache.available_blocks() == 20
    assert cache.available_blocks([1, 1]) == 12


def test_unpin_orders_later_segments_first() -> None:
    cache = GpuPrefixCache(40)
    segments = [1, 2]
    ranges = ((1, 0, 10), (2, 10, OPEN))
    cache.pin(segments)
    assert cache.allocate(20)
    cache.commit(ranges, 0, 20)
    cache.unpin(segments)
    assert list(cache.lru) == [2, 1]  # the tail segment goes first


def test_commit_frees_duplicates_of_blocks_cached_meanwhile() -> None:
    cache = GpuPrefixCache(40)
    ranges = ((1, 0, OPEN),)
    cache.pin([1])  # request A
    cache.pin([1])  # request B, same prompt, running at the same time
    assert cache.allocate(10) and cache.allocate(10)
    cache.commit(ranges, 0, 10)  # A finishes its blocks first
    assert cache.used_blocks == 20
    cache.commit(ranges, 0, 8)  # B's 8 blocks duplicate A's: freed
    assert cache.used_blocks == 12 and cache.cached[1] == 10
    assert cache.allocate(2)  # B's blocks 10 and 11
    cache.commit(ranges, 8, 12)  # B goes past A: 2 duplicates, 2 new
    assert cache.cached[1] == 12
    _invariant(cache, private=0)


def test_commit_past_a_hole_is_an_error() -> None:
    cache = GpuPrefixCache(10)
    cache.pin([1])
    cache.allocate(4)
    with pytest.raises(AssertionError, match="pinning broken"):
        cache.commit(((1, 0, OPEN),), 2, 4)
