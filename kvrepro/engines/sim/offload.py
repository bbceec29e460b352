"""Offload stores below the GPU (LMCache's CPU and local-disk backends), chunk-granular.

Each store holds chunks of `chunk_tokens` tokens (a chunk is stored only once all its tokens'
KV exists: LMCache writes whole chunks), up to `capacity_bytes`, in LRU order (or TTL: a chunk
unused for `ttl_s` expires; when full, the least recently used still goes first; or none: when
full, the store keeps what it holds and new chunks are rejected and counted).

How an LRU store makes room follows the LMCache that serves it:
* in-process LMCache (`async_eviction` false) evicts the least recently used chunk on insert;
* multi-process LMCache (`async_eviction` true, as measured in ../shared/spec/LMCACHE_CPU.md
  and read in lmcache 0.5.6's `distributed/storage_controllers/eviction_controller.py`) runs an
  eviction loop: every `EVICTION_INTERVAL_S` it checks usage and, from `EVICTION_WATERMARK`
  full, evicts `EVICTION_RATIO` of the chunks, LRU first. Between ticks a full DRAM store
  (`hard_limit`) drops new chunks (counted as rejected); a disk store's limit is soft and writes
  overshoot it until the next tick.

* lookup: like LMCache's prefix match across backends, the first store's run of leading
  chunks, then the next store continues where it stopped, and so on. A chunk whose write has
  not finished yet does not count. Admitting the request touches every chunk found (LMCache
  pins them on lookup and updates LRU order after the retrieve, prefix first).
* load: the chunks past the GPU's own hit are read; each store's read channel is a FIFO
  server, a read of n chunks takes n x chunk_bytes / read_bw + n x chunk_read_latency after
  the channel frees up (with measured `chunk_read_latency_samples_s`, each chunk draws its
  latency from them instead); stores serve their parts in parallel, the load ends with the last.
  Chunks read from a lower store are staged: copied into every faster store.
* write: computed chunks a store lacks are queued on its write channel (FIFO; a chunk is
  present once its write finishes). If the queue already holds more than
  `max_write_backlog_s` of work, the write is dropped and counted (LMCache's store path skips
  a put when its buffer is exhausted rather than stall the engine). Written through (as
  LMCache) every store gets the chunk; with the tier's `twin_write_back`
  only the first, and chunks evicted from store i are queued for store i + 1 (a victim
  cache). With `skip_l1` (LMCache's `l2_store_policy`)
  only the last store gets it, and loads from it are not staged in the faster ones: in the
  live flash tier (data/live/cpu_tiny_lmcache/flash) LMCache reported every hit from L2 and
  none from L1, its L1 only passing the L2 reads through.
* shared stores: a store whose `shared` flag is set (a shared filesystem) is, in a fleet
  with private pools, one `ChunkStore` in every instance's hierarchy: a chunk one instance
  wrote is found by the others, while each instance keeps its own read and write channels
  (the share's bandwidth as one server gets it) and byte counters.
* network: stores reached over a network (a fleet's shared pool, `kvrepro.engines.sim.fleet`)
  add `network_latency_s` to every transfer: a load ends that much later, a written chunk is
  present that much later. The latency delays a transfer without occupying its channel (the
  hop is pipelined: the next transfer's bytes follow on the wire).
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import filterfalse, islice, repeat

from kvrepro.engines.sim.config import OffloadTier, SimTier, capacity_chunks

_ABSENT = float("inf")
"""The time of a chunk a store does not hold, for `ChunkStore.run_length`'s scan."""
EVICTION_INTERVAL_S = 1.0
"""LMCache MP's eviction loop period (`time.sleep(1)` in its L1 and L2 eviction loops)."""
EVICTION_WATERMARK = 0.8
"""Usage from which the loop evicts (LMCache's `EvictionConfig.trigger_watermark` default)."""
EVICTION_RATIO = 0.2
"""Share of the chunks one triggered tick evicts (`EvictionConfig.eviction_ratio` default)."""


@dataclass(slots=True)
class Channel:
    """A FIFO server moving whole chunks: one queue, fixed bandwidth, per-chunk latency."""

    bytes_per_s: float
    chunk_latency_s: float
    busy_until_s: float = 0.0
    latency_samples_s: tuple[float, ...] = ()
    """Measured per-chunk latencies: when given, each chunk draws one (from `rng`) instead of
    `chunk_latency_s` (reads of a flash profile measured with `kvrepro.storage`)."""
    rng: random.Random | None = None

    def chunk_s(self, chunk_bytes: int) -> float:
        """Seconds one chunk occupies the channel."""
        return chunk_bytes / self.bytes_per_s + self.chunk_latency_s

    def submit(self, now_s: float, n_chunks: int, chunk_bytes: int) -> float:
        """Queue `n_chunks`; return when the last one is done."""
        start_s = max(now_s, self.busy_until_s)
        if self.latency_samples_s:
            drawn_s = sum(self.rng.choices(self.latency_samples_s, k=n_chunks))
            self.busy_until_s = start_s + n_chunks * chunk_bytes / self.bytes_per_s + drawn_s
            return self.busy_until_s
        self.busy_until_s = start_s + n_chunks * self.chunk_s(chunk_bytes)
        return self.busy_until_s

    def backlog_s(self, now_s: float) -> float:
        """Seconds of queued work ahead of a request submitted now."""
        return max(0.0, self.busy_until_s - now_s)


def read_channel(config: OffloadTier) -> Channel:
    """A store's read channel; with measured latency samples, its draws are seeded per store
    (name + latency_seed), so a run is reproducible and stores draw independently."""
    if not config.chunk_read_latency_samples_s:
        return Channel(config.read_bw_bytes_s, config.chunk_read_latency_s)
    return Channel(config.read_bw_bytes_s, config.chunk_read_latency_s,
                   latency_samples_s=tuple(config.chunk_read_latency_samples_s),
                   rng=random.Random(f"{config.name}:{config.latency_seed}"))


class ChunkStore:
    """One store: chunk id -> time it was last written or used, in LRU order.

    A chunk's time is when its write ends (possibly after now: writes queue on the channel)
    or when it was last used, so the LRU order is not the order of those times. A TTL store
    therefore keeps a min-heap of (time, chunk id) pushed at every insert and touch, and
    expires each chunk on its own time: a heap record whose time is no longer the chunk's
    (touched since, or evicted) is stale and skipped, O(log n) amortised per operation.

    `version` counts the changes of `entries` (inserts, touches, evictions, expiries): a
    waiting request asks for the same run of chunks at every step, and `run_length` answers
    again from its last scan while the store has not changed and time has not reached the
    write that stopped the scan.
    """

    def __init__(self, config: OffloadTier, kv_bytes_per_token: int):
        self.config = config
        self.name = config.name
        self.capacity_chunks = capacity_chunks(config, kv_bytes_per_token)
        self.ttl_s = config.ttl_s if config.eviction == "ttl" else None
        self.entries: OrderedDict[int, float] = OrderedDict()
        self.expiry_heap: list[tuple[float, int]] = []  # TTL stores only (see the class doc)
        self.evicted_chunks = 0
        self.expired_chunks = 0
        self.rejected_chunks = 0
        self.keeps_when_full = config.eviction == "none"
        self.first_eviction_s = float("nan")
        self.first_refusal_s = float("nan")  # the first chunk turned away because it is full
        self.async_eviction = bool(config.async_eviction) and config.eviction == "lru"
        self.hard_limit = config.hard_limit
        self.refuses_when_full = self.keeps_when_full or (self.async_eviction
                                                          and self.hard_limit)
        # evicts the least recently used chunk on insert, nothing else: batches may be
        # inserted at once (`absent_for_batch`, `insert_batch`)
        self.plain_lru = (config.eviction == "lru" and not self.async_eviction
                          and self.ttl_s is None)
        self.next_tick_s = EVICTION_INTERVAL_S
        self.version = 0
        # the last run_length scan: (ids, start, version, found, valid from, valid until)
        self._last_scan: tuple[list[int], int, int, int, float, float] | None = None

    def evict_due(self, now_s: float) -> None:
        """Run the eviction loop's ticks up to now (async eviction only).

        The store changes only at operations, so of the ticks since the last one only the
        first can find it over the watermark (a fifth evicted leaves it below): one check
        stands for all of them.
        """
        if not self.async_eviction or now_s < self.next_tick_s:
            return
        n_evict, entries = self._due_evictions(now_s), self.entries
        if n_evict:
            self.version += 1
            for _ in range(n_evict):
                entries.popitem(last=False)
            if not self.evicted_chunks:
                self.first_eviction_s = self.next_tick_s
            self.evicted_chunks += n_evict
        self.next_tick_s = (now_s // EVICTION_INTERVAL_S + 1) * EVICTION_INTERVAL_S

    def _due_evictions(self, now_s: float) -> int:
        """Chunks the eviction loop's ticks up to now evict (async eviction; 0 otherwise)."""
        n = len(self.entries)
        if (not self.async_eviction or now_s < self.next_tick_s or not n
                or n < EVICTION_WATERMARK * self.capacity_chunks):
            return 0
        return max(1, int(EVICTION_RATIO * n))

    def expire(self, now_s: float) -> None:
        """Drop chunks unused for ttl_s (TTL stores) or due to the eviction loop (async)."""
        self.evict_due(now_s)
        if self.ttl_s is None:
            return
        entries, heap, limit_s = self.entries, self.expiry_heap, now_s - self.ttl_s
        while heap and heap[0][0] <= limit_s:
            last_s, cid = heapq.heappop(heap)
            if entries.get(cid) == last_s:  # else stale: touched since, or evicted
                del entries[cid]
                self.version += 1
                self.expired_chunks += 1

    def _expired_by(self, now_s: float) -> int:
        """How many chunks `expire(now_s)` would drop for their TTL, without dropping them
        (a walk of the heap's nodes due by then)."""
        entries, heap, limit_s = self.entries, self.expiry_heap, now_s - self.ttl_s
        due: set[int] = set()
        stack = [0] if heap else []
        while stack:
            i = stack.pop()
            last_s, cid = heap[i]
            if last_s > limit_s:
                continue
            if entries.get(cid) == last_s:
                due.add(cid)
            stack.extend(j for j in (2 * i + 1, 2 * i + 2) if j < len(heap))
        return len(due)

    def peek(self, now_s: float) -> tuple[int, int]:
        """(chunks held, chunks evicted so far) as `expire(now_s)` would leave them, with
        nothing changed: a server sample reads the store through this."""
        if self.ttl_s is not None:
            return len(self.entries) - self._expired_by(now_s), self.evicted_chunks
        due = self._due_evictions(now_s)
        return len(self.entries) - due, self.evicted_chunks + due

    def _note(self, cid: int, when_s: float) -> None:
        """TTL stores: record a chunk's new time in the expiry heap (rebuilt from the
        entries when stale records outnumber live ones, so it stays O(entries))."""
        heap = self.expiry_heap
        heapq.heappush(heap, (when_s, cid))
        if len(heap) > 4 * len(self.entries) + 1024:
            heap[:] = [(t, c) for c, t in self.entries.items()]
            heapq.heapify(heap)

    def run_length(self, ids: list[int], start: int, now_s: float) -> int:
        """How many chunks from ids[start] on are present and fully written.

        The answer of the last scan stands while the store is unchanged (`version`), for the
        same `ids` list (which callers do not modify) and `start`, from the scan's time
        until the chunk that stopped it, present but still being written, is complete."""
        last = self._last_scan
        if (last is not None and last[0] is ids and last[1] == start
                and last[2] == self.version and last[4] <= now_s < last[5]):
            return last[3]
        if start < len(ids) and ids[start] not in self.entries:  # e.g. a skip_l1 staging L1
            self._last_scan = (ids, start, self.version, 0, now_s, _ABSENT)
            return 0
        # each chunk's time (inf: absent), read at C speed; then the first one not ready
        times = list(map(self.entries.get, ids[start:], repeat(_ABSENT)))
        found, until_s = len(times), _ABSENT
        if times and max(times) > now_s:
            found = 0
            for when_s in times:
                if when_s > now_s:
                    until_s = when_s
                    break
                found += 1
        self._last_scan = (ids, start, self.version, found, now_s, until_s)
        return found

    def scan_stands(self, ids: list[int], start: int, now_s: float) -> int:
        """What `run_length(ids, start, now_s)` would answer from the last scan, when that
        and `expire(now_s)` would change nothing (no eviction-loop tick and no TTL expiry
        due by then); -1 otherwise."""
        last = self._last_scan
        if (last is None or last[0] is not ids or last[1] != start
                or last[2] != self.version or not last[4] <= now_s < last[5]):
            return -1
        if self.async_eviction and now_s >= self.next_tick_s:
            return -1
        heap = self.expiry_heap
        if self.ttl_s is not None and heap and heap[0][0] <= now_s - self.ttl_s:
            return -1
        return last[3]

    def touch(self, ids: list[int], now_s: float) -> None:
        """Mark chunks used now (they move to the most recently used end)."""
        entries = self.entries
        self.version += 1
        deque(map(entries.move_to_end, ids), maxlen=0)  # most recently used, in this order
        entries.update(zip(ids, repeat(now_s)))
        if self.ttl_s is not None:
            for cid in ids:
                self._note(cid, now_s)

    def admits(self) -> bool:
        """False when full and the store keeps what it holds (eviction "none") or drops new
        chunks until its eviction loop runs (async eviction with a hard limit)."""
        return len(self.entries) < self.capacity_chunks or not self.refuses_when_full

    def refuse(self, n_chunks: int, now_s: float) -> None:
        """Count `n_chunks` turned away because the store is full and keeps what it holds."""
        if n_chunks and not self.rejected_chunks:
            self.first_refusal_s = now_s
        self.rejected_chunks += n_chunks

    def insert(self, cid: int, ready_s: float, now_s: float) -> int:
        """Make room now for a chunk complete at `ready_s`; return the id evicted, or -1."""
        entries = self.entries
        self.version += 1
        evicted = -1
        if len(entries) >= self.capacity_chunks and not self.async_eviction:
            evicted, _ = entries.popitem(last=False)
            self.evicted_chunks += 1
            if self.evicted_chunks == 1:
                self.first_eviction_s = now_s
        entries[cid] = ready_s
        if self.ttl_s is not None:
            self._note(cid, ready_s)
        return evicted


    def absent_for_batch(self, ids: list[int]) -> list[int] | None:
        """The chunks of `ids` the store lacks, when inserting them one by one (a plain LRU
        store evicting its least recently used chunk per insert when full) would evict
        none of `ids` and none of themselves: then `insert_batch` of them, or of a first
        part of them, is the same as those inserts one by one. None otherwise."""
        if not self.plain_lru:
            return None
        entries = self.entries
        new = list(filterfalse(entries.__contains__, ids))
        n_evict = len(entries) + len(new) - self.capacity_chunks
        if n_evict > 0 and (n_evict > len(entries)
                            or not set(ids).isdisjoint(islice(entries, n_evict))):
            return None
        return new

    def insert_batch(self, ids: list[int], ready_s: Iterable[float], now_s: float) -> list[int]:
        """`insert` of each chunk of `ids` (from `absent_for_batch`) in order, complete at
        the matching `ready_s`; returns the ids evicted, in order."""
        entries = self.entries
        self.version += 1
        evicted: list[int] = []
        n_evict = len(entries) + len(ids) - self.capacity_chunks
        if n_evict > 0:
            evicted = [entries.popitem(last=False)[0] for _ in range(n_evict)]
            if not self.evicted_chunks:
                self.first_eviction_s = now_s
            self.evicted_chunks += n_evict
        entries.update(zip(ids, ready_s, strict=False))  # ready_s may be a repeat()
        return evicted


class StagingBuffer:
    """LMCache's L1 in front of a `skip_l1` disk tier: not a cache but room every chunk passes
    through. A prefetch from the disk reserves room for the chunks it found until the
    request's load is done; a store reserves room for each chunk until it is on the disk.
    Without room a prefetch finds fewer chunks (the rest are recomputed) and a store is
    dropped: in the live flash tier under saturation (a held-out run at 60 sessions / min,
    2026-12-01, in git history under data/live/cpu_tiny_validation) LMCache logged both,
    "L1 reservations failed with out-of-memory" and "Failed to batched allocate". Refusals
    count on the L1 store (`rejected_chunks`)."""

    def __init__(self, store: ChunkStore):
        self.store = store
        self.held = 0
        self.releases: list[tuple[float, int]] = []

    def room(self, now_s: float) -> int:
        """Chunks that can be reserved now."""
        releases = self.releases
        while releases and releases[0][0] <= now_s:
            self.held -= heapq.heappop(releases)[1]
        return self.store.capacity_chunks - self.held

    def held_at(self, now_s: float) -> int:
        """Chunks reserved at `now_s`, without releasing any (for a server sample)."""
        return self.held - sum(n for until_s, n in self.releases if until_s <= now_s)

    def reserve(self, n_chunks: int, until_s: float, now_s: float) -> int:
        """Reserve up to `n_chunks` until `until_s`; return how many it got (the rest are
        counted as refused)."""
        got = max(0, min(n_chunks, self.room(now_s)))
        if got:
            self.held += got
            heapq.heappush(self.releases, (until_s, got))
            self.store.version += 1  # less room: a lookup's answer may change
        if got < n_chunks:
            self.store.refuse(n_chunks - got, now_s)
        return got


class OffloadHierarchy:
    """The offload stores of one tier with their channels and byte counters."""

    def __init__(self, tier: SimTier, kv_bytes_per_token: int, network_latency_s: float = 0.0,
                 shared_stores: Mapping[str, ChunkStore] | None = None):
        """`shared_stores`: store name -> a store object other hierarchies use too (a
        fleet's shared filesystem: one set of chunks that every instance reads and writes,
        each through its own channels and counters); the other stores are this tier's own."""
        self.network_latency_s = network_latency_s
        shared_stores = shared_stores or {}
        self.stores = [shared_stores[c.name] if c.name in shared_stores
                       else ChunkStore(c, kv_bytes_per_token) for c in tier.stores]
        self.names = [s.name for s in self.stores]
        self.chunk_tokens = tier.stores[0].chunk_tokens if tier.stores else 0
        self.chunk_bytes = self.chunk_tokens * kv_bytes_per_token
        self.write_back = tier.twin_write_back
        # skip_l1 (LMCache's l2_store_policy): computed KV goes to the last store only
        self.first_write = len(self.stores) - 1 if tier.skip_l1 and self.stores else 0
        self.staging = StagingBuffer(self.stores[0]) if self.first_write else None
        self.reads = [read_channel(c) for c in tier.stores]
        self.writes = [Channel(c.write_bw_bytes_s, c.chunk_write_latency_s)
                       for c in tier.stores]
        self.backlog_limit_s = [c.max_write_backlog_s for c in tier.stores]
        n = len(self.stores)
        self.bytes_written, self.bytes_read = [0] * n, [0] * n
        self.writes_dropped = [0] * n
        self.found_chunks = 0
        """Chunks the admitted requests' lookups found, the GPU's prefix hit included: LMCache
        prefetches each of them through its L1 (live: `lmcache_l1_read_chunks` 8,980 on the
        fit run's dram tier, its 2,298,880 hit tokens, where the twin loads 2,767 past
        vLLM's own hit)."""

    def l1_write_chunks(self) -> float:
        """Chunks LMCache's L1 takes in, as its `lmcache_l1_write_chunks` counts them: each
        chunk stored; where L1 only passes L2's chunks through (skip_l1), also each chunk
        found, on its way from L2 to the engine (live, on the fit run's flash tier, 9,778 =
        815 stored + 8,963 loaded from L2)."""
        stored = sum(self.bytes_written) / self.chunk_bytes
        return stored + self.found_chunks if self.staging is not None else stored

    def l1_read_chunks(self) -> float:
        """Chunks LMCache's L1 hands out, as its `lmcache_l1_read_chunks` counts them: each
        chunk found; where L1 only passes chunks through (skip_l1), also each chunk stored,
        on its way to L2 (live 9,778 on the fit run's flash tier, as many as it took in)."""
        return self.l1_write_chunks() if self.staging is not None else self.found_chunks

    def lookup(self, ids: list[int], now_s: float) -> list[int]:
        """Chunks found per store, as a prefix match that moves on store by store."""
        counts, refused = self.match(ids, now_s)
        self.refuse_prefetch(refused, now_s)
        return counts

    def match(self, ids: list[int], now_s: float) -> tuple[list[int], int]:
        """`lookup` without counting what the staging buffer refuses: (chunks found per
        store, chunks a prefetch found below L1 but has no room for). Its other effects
        (expiring chunks, the eviction loop's ticks, releasing staging room) are those of
        time passing: done again at the same `now_s` they change nothing, so the scheduler
        can ask whether a request would fit and count the refusal (`refuse_prefetch`) only
        once it decides."""
        counts, pos = [], 0
        for store in self.stores:
            store.expire(now_s)
            found = store.run_length(ids, pos, now_s)
            counts.append(found)
            pos += found
        if self.staging is not None and pos > counts[0]:  # a prefetch needs room in L1
            below = pos - counts[0]
            room = max(0, self.staging.room(now_s))
            if room < below:
                return _cap_prefix(counts, counts[0] + room), below - room
        return counts, 0

    def match_stands(self, ids: list[int], now_s: float) -> bool:
        """Whether `match(ids, now_s)` would give what the last `match(ids, ...)` gave and
        change nothing: every store answers from its last scan (`ChunkStore.scan_stands`)
        and no staging room is released by then. Nothing else changes the stores while the
        scheduler runs decode steps, so a waiting request that did not fit stays as it was."""
        pos = 0
        for store in self.stores:
            found = store.scan_stands(ids, pos, now_s)
            if found < 0:
                return False
            pos += found
        releases = self.staging.releases if self.staging is not None else None
        return not releases or releases[0][0] > now_s

    def refuse_prefetch(self, n_chunks: int, now_s: float) -> None:
        """Count `n_chunks` of a prefetch refused for want of staging room (`match`)."""
        if n_chunks:
            self.staging.store.refuse(n_chunks, now_s)

    def touch(self, ids: list[int], counts: list[int], now_s: float) -> None:
        """Mark the chunks a lookup found as used, in the store each was found in."""
        pos = 0
        for store, found in zip(self.stores, counts, strict=True):
            if found:
                store.touch(ids[pos:pos + found], now_s)
            pos += found

    def load(self, ids: list[int], counts: list[int], first: int, end: int,
             now_s: float) -> tuple[float, list[int]]:
        """Read chunks [first, end) of a lookup's result; return (done time, chunks per store).

        Each store reads its part on its own FIFO read channel; chunks from lower stores are
        then staged in the faster ones (present from the load's end), except with skip_l1.
        """
        done_s, per_store, pos = now_s, [], 0
        for i, found in enumerate(counts):
            lo, hi = max(first, pos), min(end, pos + found)
            n = max(0, hi - lo)
            per_store.append(n)
            if n:
                done_s = max(done_s, self.reads[i].submit(now_s, n, self.chunk_bytes)
                             + self.network_latency_s)
                self.bytes_read[i] += n * self.chunk_bytes
            pos += found
        if self.staging is not None:  # skip_l1: LMCache's L1 only passes L2 reads through
            self.staging.reserve(sum(per_store[1:]), done_s, now_s)
            return done_s, per_store
        pos = counts[0]
        for i in range(1, len(counts)):
            lo, hi = max(first, pos), min(end, pos + counts[i])
            if hi > lo:
                for upper in range(i):
                    self._stage(upper, ids[lo:hi], done_s, now_s)
            pos += counts[i]
        return done_s, per_store

    def _stage(self, index: int, ids: list[int], ready_s: float, now_s: float) -> None:
        """Copy chunks read from a lower store into store `index`: room is made (evictions,
        refusals, demotions) now, when the load is issued; the copies are present from
        `ready_s`, the load's end. Running any of it at `ready_s` would stamp evictions
        (`first_eviction_s`) and eviction-loop ticks in the future."""
        store = self.stores[index]
        if store.capacity_chunks == 0:
            return
        store.evict_due(now_s)
        entries, insert, admits = store.entries, store.insert, store.admits
        demotes = self.write_back and index + 1 < len(self.stores)  # write-back
        new = store.absent_for_batch(ids)
        if new is not None:  # the same as the loop below, at once
            self.bytes_written[index] += len(new) * self.chunk_bytes
            for evicted in store.insert_batch(new, repeat(ready_s), now_s):
                if demotes:  # the next store is not this one: the order is kept
                    self._write_to(index + 1, [evicted], now_s)
            return
        for cid in ids:
            if cid not in entries:
                if not admits():
                    store.refuse(1, now_s)
                    continue
                self.bytes_written[index] += self.chunk_bytes
                evicted = insert(cid, ready_s, now_s)
                if demotes and evicted >= 0:
                    self._write_to(index + 1, [evicted], now_s)

    def write(self, ids: list[int], now_s: float) -> None:
        """Store newly computed chunks (write-through: in every store; else the first)."""
        last = min(1, len(self.stores)) if self.write_back else len(self.stores)
        for index in range(self.first_write, max(last, self.first_write + 1)):
            self._write_to(index, ids, now_s)

    def _write_to(self, index: int, ids: list[int], now_s: float) -> None:
        store = self.stores[index]
        if store.capacity_chunks == 0 or not ids:
            return
        store.expire(now_s)
        entries, channel = store.entries, self.writes[index]
        chunk_s, limit_s = channel.chunk_s(self.chunk_bytes), self.backlog_limit_s[index]
        staging = self.staging if index == self.first_write else None
        insert, admits, latency_s = store.insert, store.admits, self.network_latency_s
        demotes = self.write_back and index + 1 < len(self.stores)  # write-back
        new = store.absent_for_batch(ids) if staging is None else None
        if new is not None:
            self._write_batch(index, new, now_s, demotes)
            return
        for k, cid in enumerate(ids):
            if cid in entries:
                continue
            if not admits():
                store.refuse(sum(1 for c in ids[k:] if c not in entries), now_s)
                return
            start_s = max(now_s, channel.busy_until_s)
            if start_s - now_s > limit_s:
                self.writes_dropped[index] += sum(1 for c in ids[k:] if c not in entries)
                return
            if staging is not None and not staging.reserve(1, start_s + chunk_s, now_s):
                self.writes_dropped[index] += 1  # no room in L1 to pass it through
                continue
            channel.busy_until_s = start_s + chunk_s
            self.bytes_written[index] += self.chunk_bytes
            evicted = insert(cid, channel.busy_until_s + latency_s, now_s)
            if demotes and evicted >= 0:
                self._write_to(index + 1, [evicted], now_s)

    def _write_batch(self, index: int, new: list[int], now_s: float, demotes: bool) -> None:
        """`_write_to`'s loop for chunks `new` of a plain LRU store without staging
        (`ChunkStore.absent_for_batch`): each chunk queued on the write channel in turn (the
        same float operations), dropped from the first one over the backlog limit on, then
        inserted at once; the chunks evicted are demoted in order."""
        store, channel = self.stores[index], self.writes[index]
        chunk_s, limit_s = channel.chunk_s(self.chunk_bytes), self.backlog_limit_s[index]
        latency_s, busy_s, ready_s = self.network_latency_s, channel.busy_until_s, []
        for _ in new:
            start_s = max(now_s, busy_s)
            if start_s - now_s > limit_s:
                self.writes_dropped[index] += len(new) - len(ready_s)
                break
            busy_s = start_s + chunk_s
            ready_s.append(busy_s + latency_s)
        channel.busy_until_s = busy_s
        self.bytes_written[index] += len(ready_s) * self.chunk_bytes
        for evicted in store.insert_batch(new[:len(ready_s)], ready_s, now_s):
            if demotes:
                self._write_to(index + 1, [evicted], now_s)

    def bytes_used(self, index: int, now_s: float | None = None) -> int:
        """Bytes of chunks held by store `index` (writes in flight included; a staging
        buffer's: its reservations); with `now_s`, as they stand then (chunks a TTL or the
        eviction loop drops by then are gone), read without changing the store."""
        if index == 0 and self.staging is not None:
            held = self.staging.held if now_s is None else self.staging.held_at(now_s)
            return held * self.chunk_bytes
        store = self.stores[index]
        held = len(store.entries) if now_s is None else store.peek(now_s)[0]
        return held * self.chunk_bytes


def _cap_prefix(counts: list[int], total: int) -> list[int]:
    """Per-store counts of a prefix match cut to `total` chunks, store by store."""
    out, left = [], total
    for found in counts:
        take = min(found, max(0, left))
        out.append(take)
        left -= take
    return out
