"""Simulator details of issue 16 item 8: TTL expiry of out-of-order entries, eviction times of
staged chunks, read-only samples, FIFO of the client backlog, and a MoE batch's weights."""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest

from kvrepro.engines.sim import SimProfile, simulate
from kvrepro.engines.sim.config import OffloadTier, SimTier
from kvrepro.engines.sim.offload import ChunkStore, OffloadHierarchy
from kvrepro.engines.sim.outputs import sample_row
from kvrepro.engines.sim.scheduler import Scheduler
from kvrepro.engines.sim.steptime import StepTimer
from kvrepro.model_spec import ModelSpec
from kvrepro.workload import generate_agentic
from kvrepro.workload.base import Workload
from tests.engines.sim.conftest import (
    CHUNK,
    CHUNK_BYTES,
    KV_BYTES,
    offload_tier,
    small_spec,
    table_workload,
)

# ---------------------------------------------------------------------- TTL expiry


def test_ttl_expiry_does_not_wait_for_a_chunk_written_later() -> None:
    """A chunk whose write ends in the future sits at the front of the LRU order; a chunk
    inserted after it but ready sooner must still expire on its own time."""
    store = ChunkStore(offload_tier(chunks=10, eviction="ttl", ttl_s=5.0), KV_BYTES)
    store.insert(1, 10.0, 0.0)  # queued write: present from 10 s, expires at 15 s
    store.insert(2, 1.0, 1.0)  # present from 1 s, expires at 6 s
    store.expire(7.0)
    assert list(store.entries) == [1] and store.expired_chunks == 1
    store.expire(15.0)
    assert not store.entries and store.expired_chunks == 2


def _reference_expire(last_s: dict[int, float], now_s: float, ttl_s: float) -> set[int]:
    """Brute force: every chunk whose own last use (or write end) is ttl_s old is gone."""
    return {cid for cid, t in last_s.items() if t > now_s - ttl_s}


def test_ttl_expiry_matches_a_brute_force_scan_under_random_operations() -> None:
    rng = random.Random(7)
    ttl_s = 3.0
    store = ChunkStore(offload_tier(chunks=10_000, eviction="ttl", ttl_s=ttl_s), KV_BYTES)
    last_s: dict[int, float] = {}
    now_s, next_id = 0.0, 0
    for _ in range(3000):
        now_s += rng.expovariate(5.0)
        op = rng.random()
        if op < 0.5:  # a write that completes up to 4 s from now (queued channel)
            ready_s = now_s + rng.uniform(0.0, 4.0)
            store.insert(next_id, ready_s, now_s)
            last_s[next_id] = ready_s
            next_id += 1
        elif op < 0.8 and last_s:
            store.expire(now_s)
            last_s = {c: t for c, t in last_s.items() if c in _reference_expire(
                last_s, now_s, ttl_s)}
            present = [c for c, t in last_s.items() if t <= now_s]
            for cid in rng.sample(present, min(3, len(present))):
                store.touch([cid], now_s)
                last_s[cid] = now_s
        else:
            store.expire(now_s)
            last_s = {c: t for c, t in last_s.items() if t > now_s - ttl_s}
        assert set(store.entries) == set(last_s), f"differs at {now_s:.3f} s"
    assert store.expired_chunks == next_id - len(last_s)


# ---------------------------------------------------------------------- staging times


def _two_stores(upper: OffloadTier) -> OffloadHierarchy:
    lower = offload_tier("flash", 100, read_bw_bytes_s=CHUNK_BYTES)  # 1 s per chunk read
    return OffloadHierarchy(SimTier(stores=[upper, lower]), KV_BYTES)


@pytest.mark.parametrize("eviction", ["lru", "none"])
def test_staging_counts_evictions_and_refusals_at_the_time_they_happen(eviction: str) -> None:
    off = _two_stores(offload_tier("staging", 2, eviction=eviction))
    staging, flash = off.stores
    for cid in (1, 2):
        staging.insert(cid, 0.0, 0.0)
    for cid in (10, 11, 12):
        flash.insert(cid, 0.0, 0.0)
    ids = [10, 11, 12]
    counts = off.lookup(ids, 5.0)
    assert counts == [0, 3]
    done_s, _ = off.load(ids, counts, 0, 3, 5.0)
    assert done_s == pytest.approx(8.0)  # the read ends 3 s after it starts
    if eviction == "lru":
        assert staging.evicted_chunks >= 1 and staging.first_eviction_s == 5.0
        assert staging.entries[12] == pytest.approx(done_s)  # staged: present from the end
    else:
        assert staging.rejected_chunks == 3 and staging.first_refusal_s == 5.0


def test_staging_runs_no_eviction_tick_ahead_of_now() -> None:
    """Multi-process L1 (async eviction): staging a load ending at 8.5 s, done at 5 s, must
    not run the eviction loop's ticks of 6-8 s already."""
    off = _two_stores(offload_tier("staging", 5, async_eviction=True, hard_limit=False))
    staging, flash = off.stores
    for cid in (1, 2, 3, 4):
        staging.insert(cid, 0.0, 0.0)  # 4 of 5: at the 80 % watermark
    for cid in (10, 11, 12):
        flash.insert(cid, 0.0, 0.0)
    counts = off.lookup([10, 11, 12], 5.5)  # the lookup runs the tick of 1 s: one evicted
    assert staging.first_eviction_s == 1.0 and staging.next_tick_s == 6.0
    off.load([10, 11, 12], counts, 0, 3, 5.5)
    assert staging.next_tick_s == 6.0 and staging.evicted_chunks == 1


# ---------------------------------------------------------------------- read-only samples


def _store_state(sched: Scheduler) -> list[tuple]:
    state = []
    for store in sched.offload.stores:
        state.append((list(store.entries.items()), store.evicted_chunks, store.expired_chunks,
                      store.rejected_chunks, store.next_tick_s, str(store.first_eviction_s)))
    if sched.offload.staging is not None:
        state.append((sched.offload.staging.held, list(sched.offload.staging.releases)))
    return state


@pytest.mark.parametrize("config", [dict(eviction="ttl", ttl_s=5.0),
                                    dict(async_eviction=True)])
def test_sample_row_changes_no_store(profile: SimProfile, config: dict) -> None:
    chunk_bytes = CHUNK * profile.server.model_spec().kv_bytes_per_token
    tier = SimTier(stores=[offload_tier("dram", 10, capacity_bytes=10 * chunk_bytes, **config)])
    sched = Scheduler(profile.server, tier, StepTimer(profile.server))
    assert sched.offload.stores[0].capacity_chunks == 10
    store = sched.offload.stores[0]
    for cid in range(9):
        store.insert(cid, 0.5, 0.5)
    before = _store_state(sched)
    row = sample_row(7.0, sched)  # past the TTL and past an eviction tick
    assert _store_state(sched) == before
    # the sample still counts what the store would hold at 7 s
    if config.get("eviction") == "ttl":
        assert row["dram_bytes_used"] == 0
    else:
        assert row["dram_evicted_chunks"] == 1 and row["dram_bytes_used"] == 8 * chunk_bytes
    store.expire(7.0)
    assert row["dram_bytes_used"] == sched.offload.bytes_used(0)
    assert row["dram_evicted_chunks"] == store.evicted_chunks


def _sampled_every(profile: SimProfile, interval_s: float, tier: str, workload: Workload):
    prof = profile.model_copy(deep=True)
    prof.sample_interval_s = interval_s
    if tier == "dram":
        prof.tiers["dram"].stores[0].eviction = "ttl"
        prof.tiers["dram"].stores[0].ttl_s = 30.0
    return simulate(workload, prof, tier, progress=False)


@pytest.mark.parametrize("tier", ["dram", "flash"])
def test_sampling_rate_does_not_change_the_run(profile: SimProfile, tier: str) -> None:
    workload = generate_agentic(small_spec(duration_s=300))
    fine = _sampled_every(profile, 1.0, tier, workload)
    coarse = _sampled_every(profile, 100.0, tier, workload)
    pd.testing.assert_frame_equal(fine.records, coarse.records)
    on_grid = fine.samples[fine.samples.time_s.isin(coarse.samples.time_s)]
    pd.testing.assert_frame_equal(on_grid.reset_index(drop=True),
                                  coarse.samples.reset_index(drop=True))


# ---------------------------------------------------------------------- client backlog FIFO




def test_backlogged_turns_are_sent_in_the_order_they_became_due(profile: SimProfile) -> None:
    """Two sessions finish in the same step and release two slots while three turns wait in
    the client; each finished session's next turn is due at once. The two longest-waiting
    turns must get the slots, and the third goes before the two new ones."""
    nan = math.nan
    # session 0 prefills alone in the first step; session 1 (arriving during it, one output
    # token fewer) prefills in the second: both finish in the fifth step
    rows = [(0, 0, 0.0, 0.0, 100, 5), (0, 1, 0.0, nan, 50, 5),
            (1, 0, 0.0, 0.001, 100, 4), (1, 1, 0.0, nan, 50, 5),
            (2, 0, 0.0, 0.002, 100, 5), (3, 0, 0.0, 0.003, 100, 5),
            (4, 0, 0.0, 0.004, 100, 5)]
    workload = table_workload(rows, {0: 0.0, 1: 0.001, 2: 0.002, 3: 0.003, 4: 0.004})
    result = simulate(workload, profile, "baseline", max_in_flight=2, progress=False)
    rec = result.records.sort_values(["send_s", "session_id"], kind="stable")
    first_two = rec[rec.turn == 0].sort_values("finish_s")
    assert first_two.finish_s.iloc[0] == first_two.finish_s.iloc[1]  # released together
    sent = list(zip(rec.session_id, rec.turn, strict=True))
    assert sent.index((2, 0)) < sent.index((3, 0)) < sent.index((4, 0))
    assert sent.index((4, 0)) < min(sent.index((0, 1)), sent.index((1, 1)))
    by = rec.set_index(["session_id", "turn"]).send_s
    assert by[(2, 0)] == by[(3, 0)] == first_two.finish_s.iloc[0]


# ---------------------------------------------------------------------- MoE weights per step


def _moe_model(**kw: object) -> ModelSpec:
    params = dict(name="test-moe", attention="gqa", num_layers=4, num_attention_heads=8,
                  num_kv_heads=2, head_dim=64, hidden_size=512, kv_dtype_bytes=2,
                  params_total_b=8.2, params_active_b=0.6, weight_bytes_per_param=1,
                  num_experts=64, experts_per_token=4)
    params.update(kw)
    return ModelSpec(**params)


def test_step_memory_reads_the_experts_its_tokens_touch(profile: SimProfile) -> None:
    server = profile.server.model_copy(update={"model": _moe_model()})
    timer = StepTimer(server)
    bw_bytes_s = server.gpu_spec().mem_bw_tb_s * 1e12 * server.decode_efficiency
    per_expert = (8.2e9 - 0.6e9) / (64 - 4)  # bytes: 1 byte per parameter
    dense = 0.6e9 - 4 * per_expert
    for tokens in (1, 16, 256):
        experts = 64 * (1 - (1 - 4 / 64) ** tokens)
        assert timer.memory_s(1000, tokens) == pytest.approx(
            (dense + experts * per_expert + 1000 * 2 * 4 * 2 * 64 * 2) / bw_bytes_s)
    assert timer.memory_s(1000) == pytest.approx(timer.memory_s(1000, 1))


def test_scheduler_times_a_step_with_the_tokens_it_schedules(profile: SimProfile) -> None:
    """A one-token request runs the first step alone; eight 100-token prompts sent during it
    then run one prefill step of 800 tokens and 19 decode steps of 8 tokens (one per
    request): a MoE reads the experts of 800 tokens, then of 8."""
    prof = profile.model_copy(deep=True)
    prof.server = profile.server.model_copy(update={"model": _moe_model()})
    rows = [(0, 0, 0.0, 0.0, 1, 1)] + [(s, 0, 0.0, 1e-6, 100, 20) for s in range(1, 9)]
    arrivals = {0: 0.0} | {s: 1e-6 for s in range(1, 9)}
    result = simulate(table_workload(rows, arrivals), prof, "baseline", progress=False)
    timer, n = StepTimer(prof.server), 8
    expected_s = timer.step_s([(1, 0)], 1, batch_tokens=1)
    expected_s += timer.step_s([(100, 0)] * n, n * 100, batch_tokens=n * 100)
    for j in range(1, 20):
        expected_s += timer.step_s([], n * (100 + j), batch_tokens=n)
    result.records = result.records[result.records.session_id > 0]
    assert (result.records.output_tokens == 20).all()
    assert result.records.finish_s.to_numpy() == pytest.approx([expected_s] * n)
    assert timer.memory_s(0, n) > 1.5 * timer.memory_s(0, 1)  # the batch matters here


@pytest.mark.parametrize("batch_tokens", [1, 3, 8, 700])
def test_step_timer_agrees_with_the_roofline(profile: SimProfile, batch_tokens: int) -> None:
    from kvrepro.calc.roofline import decode_step_s

    for model in (profile.server.model_spec(), _moe_model()):
        server = profile.server.model_copy(update={"model": model})
        timer = StepTimer(server)
        want_s = decode_step_s(model, server.gpu_spec(), 5000, batch_tokens=batch_tokens)
        assert timer.memory_s(5000, batch_tokens) == pytest.approx(
            want_s / server.decode_efficiency, rel=1e-12)
