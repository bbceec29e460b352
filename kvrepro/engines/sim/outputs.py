"""What a simulated run emits: request records, server samples and the run folder.

Records carry `kvrepro.records.RECORD_COLUMNS` plus what the simulator knows exactly:
`gpu_hit_tokens`, `loaded_tokens_<store>` (first admission; with the GPU hit they add up to
`cached_prompt_tokens`), `recomputed_tokens` (tokens prefilled on the GPU, re-prefills after
preemption included), `load_s` (time spent waiting for offload loads), `queue_s` (send to
first admission), `engine_queue_s` (first admission less `Request.queued_s`, plus the server's
`engine_intake_s`: vLLM's queue time, which starts when the engine core's loop takes the
request in, after the step in flight, and ends in the `schedule()` that admits it) and
`preemptions`.

Samples carry `time_s`, `running`, `waiting` (queued or loaded, not yet running), `loading`,
`gpu_kv_usage_frac` (blocks referenced by requests, as vLLM reports KV usage),
`gpu_kv_occupied_frac` (referenced + cached-but-free blocks), cumulative
`prefix_cache_queries_tokens` / `prefix_cache_hits_tokens` (GPU prefix cache, like vLLM's
counters), `external_prefix_cache_queries_tokens` / `external_prefix_cache_hits_tokens`
(offload), `preemptions`, `prompt_tokens`, `generation_tokens`, and per offload store
`<store>_bytes_used`, `<store>_bytes_written`, `<store>_bytes_read`, `<store>_writes_dropped`
(chunks), `<store>_evicted_chunks`, `<store>_rejected_chunks` (turned away when full:
eviction "none", a multi-process LMCache L1 between its eviction loop's ticks, a staging
buffer without room),
`<store>_capacity_bytes` (what the store can hold in whole chunks: the configured capacity
rounded down to a multiple of the chunk size).

A store has *filled* when it first evicts a chunk (or, with eviction "none", first refuses
one): `kvrepro.analysis.fill_time_s` reads that from the evicted / rejected counters of the
samples, or exactly from the run's stats (`<store>_first_eviction_s`,
`<store>_first_refusal_s`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from kvrepro.records import RECORD_COLUMNS, RunWriter, typed_records

if TYPE_CHECKING:
    from kvrepro.engines.sim.scheduler import Scheduler

WRITE_BATCH = 1000
"""Records and samples are written to the run folder in batches of this many."""


def sample_row(now_s: float, sched: Scheduler) -> dict[str, Any]:
    """One server sample of the scheduler's state and counters at `now_s`.

    Read-only: the stores are read as they stand at `now_s` (`ChunkStore.peek`: chunks a TTL
    or a due eviction-loop tick drops count as gone) without changing them, so how often a
    run is sampled cannot change what it does."""
    referenced, occupied = sched.gpu.usage()
    c = sched.counters
    row: dict[str, Any] = {
        "time_s": now_s, "running": len(sched.running),
        "waiting": len(sched.waiting) + len(sched.ready), "loading": sched.loading,
        "gpu_kv_usage_frac": referenced, "gpu_kv_occupied_frac": occupied,
        "prefix_cache_queries_tokens": c.prefix_queries_tokens,
        "prefix_cache_hits_tokens": c.prefix_hits_tokens,
        "external_prefix_cache_queries_tokens": c.external_queries_tokens,
        "external_prefix_cache_hits_tokens": c.external_hits_tokens,
        "preemptions": c.preemptions, "prompt_tokens": c.prompt_tokens,
        "generation_tokens": c.generation_tokens}
    off = sched.offload
    if off is not None:
        row.update(lmcache_lookup_tokens=c.lmcache_lookup_tokens,
                   lmcache_l1_read_chunks=off.l1_read_chunks(),
                   lmcache_l1_write_chunks=off.l1_write_chunks())
        for i, store in enumerate(off.stores):
            row[f"{store.name}_bytes_used"] = off.bytes_used(i, now_s)
            row[f"{store.name}_bytes_written"] = off.bytes_written[i]
            row[f"{store.name}_bytes_read"] = off.bytes_read[i]
            row[f"{store.name}_writes_dropped"] = off.writes_dropped[i]
            row[f"{store.name}_evicted_chunks"] = store.peek(now_s)[1]
            row[f"{store.name}_rejected_chunks"] = store.rejected_chunks
            row[f"{store.name}_capacity_bytes"] = store.capacity_chunks * off.chunk_bytes
    return row


class OutputSink:
    """Collects records and samples; with a run folder, writes them in batches.

    A crashed simulation can simply be rerun, so batches (not per-line flushes) are enough;
    the folder is still readable after a crash up to the last batch.
    """

    def __init__(self, run_dir: str | Path | None, meta: dict[str, Any]):
        self.records: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self._written = [0, 0]
        self.writer = RunWriter(run_dir, meta, fsync_every=0) if run_dir is not None else None

    def add_record(self, record: dict[str, Any]) -> None:
        """Keep one finished request's record."""
        self.records.append(record)
        if self.writer is not None and len(self.records) - self._written[0] >= WRITE_BATCH:
            self._flush()

    def add_sample(self, sample: dict[str, Any]) -> None:
        """Keep one server sample."""
        self.samples.append(sample)
        if self.writer is not None and len(self.samples) - self._written[1] >= WRITE_BATCH:
            self._flush()

    def _flush(self) -> None:
        for record in self.records[self._written[0]:]:
            self.writer.write_record(record)
        for sample in self.samples[self._written[1]:]:
            self.writer.write_sample(sample)
        self._written = [len(self.records), len(self.samples)]

    def finish(self, stats: dict[str, Any]) -> None:
        """Write what is left and close the folder with the run's stats in meta.json."""
        if self.writer is not None:
            self._flush()
            self.writer.close("finished", stats=stats)
            self.writer = None

    def __enter__(self) -> OutputSink:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.writer is not None:
            self._flush()
            status = "finished" if exc_type is None else f"failed: {exc_type.__name__}: {exc}"
            self.writer.close(status)
            self.writer = None

    def records_frame(self) -> pd.DataFrame:
        """Records typed like `kvrepro.records.read_run` returns them (with `ttft_s`)."""
        extra = list(dict.fromkeys(k for r in self.records[:1] for k in r
                                   if k not in RECORD_COLUMNS))
        records = self.records
        # column by column (every record has the same keys): faster than from the dicts
        columns = {name: [r[name] for r in records] for name in [*RECORD_COLUMNS, *extra]}
        return typed_records(pd.DataFrame(columns))

    def samples_frame(self) -> pd.DataFrame:
        """Samples as a frame, one row per sample."""
        return pd.DataFrame(self.samples)
