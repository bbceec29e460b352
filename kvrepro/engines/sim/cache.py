"""The GPU prefix cache, block-granular, counted per segment instead of per block.

vLLM keeps full KV blocks in a hash-indexed pool; blocks of running requests are referenced,
freed blocks stay cached until an allocation needs them, and the least recently freed goes
first. When a request ends its blocks are freed tail first, so a context loses its *last*
blocks first and what stays cached of it is always a run of leading blocks. The simulator
uses that: per segment (see `blocks`) it stores only how many leading blocks are cached.

* hit: walk the request's segments, adding each one's cached count until one falls short;
* pin: a running request references all its segments, which makes them unevictable;
* unpin: when the last reference goes, the segment joins the LRU end (a request's segments
  are appended last-first, so its later segments are evicted before its earlier ones);
* evict: take blocks from the tail of the least recently used segment;
* commit: when a request finishes computing full blocks, they join their segment's cached
  run (or, if another request cached them meanwhile, the duplicate is freed).

Accounting invariant: used_blocks = sum of cached counts + blocks private to requests (their
partial last block and blocks not yet committed).
"""

from __future__ import annotations

from collections import OrderedDict

from kvrepro.engines.sim.prefix_units import OPEN, UnitRanges


class GpuPrefixCache:
    """Block pool of `capacity_blocks` with per-segment cached runs and LRU eviction."""

    def __init__(self, capacity_blocks: int):
        if capacity_blocks <= 0:
            raise ValueError(f"parameter 'capacity_blocks' must be > 0, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self.used_blocks = 0
        self.evictable_blocks = 0
        self.evicted_blocks = 0
        self.cached: dict[int, int] = {}
        self.refs: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()

    def hit_blocks(self, ranges: UnitRanges, max_blocks: int) -> int:
        """Leading blocks of a request that are cached, at most `max_blocks`."""
        cached = self.cached
        for number, b0, b1 in ranges:
            if b0 >= max_blocks:
                return max_blocks
            end = max_blocks if b1 == OPEN or b1 > max_blocks else b1
            k = cached.get(number, 0)
            if k < end - b0:
                return b0 + k
        return max_blocks

    def available_blocks(self, segments: list[int] | None = None) -> int:
        """Blocks an allocation could get, not counting cached blocks of `segments`, which
        the allocating request is about to pin."""
        free = self.capacity_blocks - self.used_blocks + self.evictable_blocks
        if segments:
            refs, cached = self.refs, self.cached
            if len(segments) == 1:  # the common case, without the set
                number = segments[0]
                return free - (cached.get(number, 0) if number not in refs else 0)
            free -= sum(cached.get(s, 0) for s in set(segments) if s not in refs)
        return free

    def pin(self, segments: list[int]) -> None:
        """Reference segments (a request starts using them); they leave the LRU order."""
        refs, lru = self.refs, self.lru
        for number in segments:
            count = refs.get(number, 0)
            if count == 0 and number in lru:
                del lru[number]
                self.evictable_blocks -= self.cached[number]
            refs[number] = count + 1

    def unpin(self, segments: list[int]) -> None:
        """Drop references; unreferenced segments join the LRU end, later segments first."""
        refs, lru, cached = self.refs, self.lru, self.cached
        for number in reversed(segments):
            count = refs[number] - 1
            if count:
                refs[number] = count
                continue
            del refs[number]
            k = cached.get(number, 0)
            if k:
                lru[number] = None
                self.evictable_blocks += k

    def allocate(self, n_blocks: int) -> bool:
        """Take `n_blocks` from the free pool, evicting LRU blocks if needed."""
        shortfall = n_blocks - (self.capacity_blocks - self.used_blocks)
        if shortfall > 0:
            if shortfall > self.evictable_blocks:
                return False
            self._evict(shortfall)
        self.used_blocks += n_blocks
        return True

    def can_allocate(self, n_blocks: int, keep: set[int]) -> bool:
        """Whether `allocate(n_blocks)` would succeed without evicting blocks of segments
        `keep` (it evicts the least recently used segments' blocks, front first)."""
        shortfall = n_blocks - (self.capacity_blocks - self.used_blocks)
        if shortfall <= 0:
            return True
        if shortfall > self.evictable_blocks:
            return False
        cached = self.cached
        for number in self.lru:
            if number in keep:
                return False
            shortfall -= cached[number]
            if shortfall <= 0:
                break
        return True

    def _evict(self, n_blocks: int) -> None:
        lru, cached = self.lru, self.cached
        while n_blocks > 0:
            number = next(iter(lru))
            k = cached[number]
            take = min(k, n_blocks)
            if take == k:
                del lru[number]
                del cached[number]
            else:
                cached[number] = k - take
            n_blocks -= take
            self.evictable_blocks -= take
            self.used_blocks -= take
            self.evicted_blocks += take

    def free(self, n_blocks: int) -> None:
        """Return private blocks (a request's uncommitted ones) to the free pool."""
        self.used_blocks -= n_blocks

    def commit(self, ranges: UnitRanges, first: int, end: int) -> None:
        """Blocks [first, end) of a request are now full and computed: cache them.

        The request's segments are pinned, so each segment's run reaches at least the
        request's first uncommitted block; blocks another request cached meanwhile are
        duplicates, and the request's own copies are freed.
        """
        cached = self.cached
        for number, b0, b1 in ranges:
            stop = end if b1 == OPEN else min(b1, end)
            start = max(b0, first)
            if start < stop:
                k = cached.get(number, 0)
                lo, hi = start - b0, stop - b0
                if k < lo:
                    raise AssertionError(f"segment {number}: cached run {k} ends before "
                                         f"committed block {lo} (pinning broken)")
                self.used_blocks -= min(k, hi) - lo
                if hi > k:
                    cached[number] = hi
            if b1 != OPEN and b1 >= end:
                break

    def usage(self) -> tuple[float, float]:
        """(referenced fraction, occupied fraction): vLLM's KV usage counts referenced
        blocks only; occupied adds cached blocks nobody references."""
        referenced = self.used_blocks - self.evictable_blocks
        return referenced / self.capacity_blocks, self.used_blocks / self.capacity_blocks
