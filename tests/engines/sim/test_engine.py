"""Whole-engine properties: conservation, determinism, tier equivalences, fill monotonicity,
the run folder and the analysis on simulated records."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvrepro.analysis.runs import (
    fill_time_s,
    resume_stats,
    retained_share,
    throughput_over_time,
)
from kvrepro.engines.sim import SimProfile, simulate
from kvrepro.records import RECORD_COLUMNS, read_run, read_runs
from kvrepro.workload import generate_agentic
from kvrepro.workload.trace_replay import read_mooncake_trace, trace_to_workload
from tests.engines.sim.conftest import PROFILE_PATH, small_spec

MOONCAKE = Path(__file__).resolve().parents[4] / "shared" / "data" / "mooncake"


def _with_dram(profile: SimProfile, capacity_bytes: float) -> SimProfile:
    out = profile.model_copy(deep=True)
    out.tiers["dram"].stores[0].capacity_bytes = capacity_bytes
    return out


def _accounted(result) -> None:
    s = result.stats
    assert s["arrived"] == s["finished"] + s["failed"] + s["unfinished"]
    assert len(result.records) == s["finished"] + s["failed"]


def test_every_request_is_accounted_for(profile, workload) -> None:
    full = simulate(workload, profile, "flash", progress=False)
    _accounted(full)
    assert full.stats["unfinished"] == 0
    assert full.stats["arrived"] + full.stats["turns_not_sent"] == len(workload.turns)
    long = full.records[full.records.output_tokens > 20].iloc[len(full.records) // 3]
    end_s = float(long.first_token_s) + 1e-6  # that request is decoding then
    cut = simulate(workload, profile, "flash", hard_end_s=end_s, progress=False)
    _accounted(cut)
    assert cut.stats["unfinished"] > 0 and cut.stats["end_s"] == end_s
    assert (cut.records.finish_s <= end_s).all()


def test_same_workload_same_records(profile, workload) -> None:
    a = simulate(workload, profile, "dram", progress=False)
    b = simulate(workload, profile, "dram", progress=False)
    pd.testing.assert_frame_equal(a.records, b.records)
    pd.testing.assert_frame_equal(a.samples, b.samples)


def test_zero_offload_capacity_is_the_baseline(profile, workload) -> None:
    base = simulate(workload, profile, "baseline", progress=False)
    empty = simulate(workload, _with_dram(profile, 0.0), "dram", progress=False)
    columns = [c for c in base.records.columns if c != "tier"]
    pd.testing.assert_frame_equal(base.records[columns], empty.records[columns])
    assert (empty.records.loaded_tokens_dram == 0).all()
    assert empty.samples.dram_bytes_written.max() == 0


def test_records_are_consistent(profile, workload) -> None:
    result = simulate(workload, profile, "flash", warmup_s=30.0, progress=False)
    r = result.records
    assert set(RECORD_COLUMNS) <= set(r.columns)
    assert (r.engine == "sim").all() and (r.tier == "flash").all() and (r.error == "").all()
    assert (r.send_s <= r.first_token_s).all() and (r.first_token_s <= r.finish_s).all()
    loaded = r.loaded_tokens_staging + r.loaded_tokens_flash
    assert (r.cached_prompt_tokens == r.gpu_hit_tokens + loaded).all()
    assert (r.cached_prompt_tokens < r.prompt_tokens).all()
    assert (r.is_warmup == (r.send_s < 30.0)).all()
    assert (r.queue_s >= 0).all() and (r.load_s >= 0).all()
    assert r.output_tokens.sum() == result.stats["generation_tokens"]
    assert loaded.sum() > 0 and r.is_resume.any()


def test_vllms_queue_time_starts_when_the_step_in_flight_ends(profile, workload) -> None:
    """vLLM's engine core takes a new request in between steps (QUEUED), so its queue time
    leaves out the step in flight at arrival; the twin's `queue_s` (from the send) keeps it.
    Where the server was idle they agree; where it was busy but had room, the request is
    scheduled by the very next step: vLLM's queue time is 0."""
    r = simulate(workload, profile, "baseline", progress=False).records
    in_flight_s = r.queue_s - r.engine_queue_s
    assert (r.engine_queue_s >= 0).all() and (in_flight_s >= 0).all()
    assert (in_flight_s == 0).any() and (in_flight_s > 0).any()
    assert (r.engine_queue_s[in_flight_s > 0] == 0).mean() > 0.5


def test_the_engines_intake_adds_to_vllms_queue_time_only(profile, workload) -> None:
    """`engine_intake_s` is work inside the twin's step overhead: it moves no event, only
    the queue time the twin reports as vLLM's."""
    intake = profile.model_copy(update={"server": profile.server.model_copy(
        update={"engine_intake_s": 0.001})})
    base, more = (simulate(workload, p, "baseline", progress=False).records
                  for p in (profile, intake))
    pd.testing.assert_frame_equal(more.drop(columns="engine_queue_s"),
                                  base.drop(columns="engine_queue_s"))
    assert (more.engine_queue_s - base.engine_queue_s).to_numpy() == pytest.approx(0.001)


def test_requests_too_long_fail_with_an_error(profile) -> None:
    workload = generate_agentic(small_spec(context_cap_tokens=10_000, duration_s=300))
    result = simulate(workload, profile, "baseline", progress=False)
    failed = result.records[result.records.error != ""]
    assert len(failed) == result.stats["failed"] > 0
    assert failed.first_token_s.isna().all()
    assert "max_model_len" in failed.error.iloc[0]
    _accounted(result)


def test_run_folder_reads_back_like_a_live_run(profile, workload, tmp_path: Path) -> None:
    results = {tier: simulate(workload, profile, tier, run_dir=tmp_path / tier,
                              progress=False) for tier in ("baseline", "dram")}
    run = read_run(tmp_path / "dram")
    assert run.meta["engine"] == "sim" and run.meta["tier"] == "dram"
    assert run.meta["workload_digest"] == workload.digest()
    assert run.meta["status"] == "finished" and run.meta["stats"]["finished"] == len(
        run.records)
    pd.testing.assert_frame_equal(run.records, results["dram"].records, check_dtype=False)
    assert len(run.samples) == len(results["dram"].samples)
    records, samples = read_runs([tmp_path / "baseline", tmp_path / "dram"])
    assert set(records.tier) == {"baseline", "dram"} and set(samples.tier) == {"baseline",
                                                                             "dram"}


def test_analysis_runs_on_simulated_records(profile, workload) -> None:
    records = pd.concat([simulate(workload, profile, tier, warmup_s=30.0,
                                  progress=False).records
                         for tier in ("baseline", "dram", "flash")], ignore_index=True)
    binned = throughput_over_time(records, bin_s=60.0, run_s=600.0)
    assert set(binned.tier) == {"baseline", "dram", "flash"}
    assert (binned.total_tok_s >= 0).all() and binned.total_tok_s.max() > 0
    stats = resume_stats(records).set_index("tier")
    assert (stats.n_resumes > 0).all()
    assert stats.loc["baseline", "resume_ttft_median_s"] >= stats.loc[
        "dram", "resume_ttft_median_s"]


def test_a_tier_that_never_fills_keeps_its_throughput(profile) -> None:
    workload = generate_agentic(small_spec(session_rate_per_min=40, duration_s=600))
    result = simulate(workload, _with_dram(profile, 50e9), "dram", progress=False)
    assert math.isnan(result.stats["dram_first_eviction_s"])
    binned = throughput_over_time(result.records, bin_s=60.0, run_s=600.0)
    assert retained_share(binned, smooth_bins=3).iloc[0] >= 0.9


def _fill_s(result, store: str = "dram") -> float:
    value = result.stats[f"{store}_first_eviction_s"]
    return math.inf if math.isnan(value) else value


@pytest.mark.parametrize("eviction", ["lru", "none"])
def test_fill_time_is_the_store_s_first_eviction_or_refusal(profile, workload, eviction) -> None:
    small = _with_dram(profile, 16e6)
    small.tiers["dram"].stores[0].eviction = eviction
    result = simulate(workload, small, "dram", progress=False)
    stats, samples = result.stats, result.samples
    # the store itself noted the moment: an eviction (LRU) or a refusal (keeps when full)
    exact_s = stats["dram_first_eviction_s" if eviction == "lru" else "dram_first_refusal_s"]
    other = stats["dram_first_refusal_s" if eviction == "lru" else "dram_first_eviction_s"]
    assert math.isfinite(exact_s) and math.isnan(other)
    assert fill_time_s(samples, "dram_bytes_used", stats=stats) == exact_s
    # from the samples alone: the first sample taken at or after it
    sampled_s = fill_time_s(samples, "dram_bytes_used")
    interval_s = profile.sample_interval_s
    assert exact_s <= sampled_s < exact_s + interval_s + 1e-9
    counter = "dram_evicted_chunks" if eviction == "lru" else "dram_rejected_chunks"
    assert samples[counter].iloc[-1] == stats[counter]
    assert (samples.loc[samples.time_s < sampled_s, counter] == 0).all()
    # the store holds its whole-chunk capacity no later than it first evicts or refuses
    full = samples.dram_bytes_used >= samples.dram_capacity_bytes
    assert samples.time_s[full].min() <= sampled_s


def test_more_dram_never_fills_sooner(profile, workload) -> None:
    fills, sampled = [], []
    for capacity in (4e6, 16e6, 64e6, 256e6, 50e9):
        result = simulate(workload, _with_dram(profile, capacity), "dram", progress=False)
        fills.append(_fill_s(result))
        sampled.append(fill_time_s(result.samples, "dram_bytes_used"))
    assert fills == sorted(fills) and math.isinf(fills[-1]) and math.isfinite(fills[0])
    finite = [s for s in sampled if not math.isnan(s)]
    assert finite == sorted(finite) and len(finite) >= 3


def test_higher_session_rate_never_fills_later(profile) -> None:
    fills = [_fill_s(simulate(generate_agentic(small_spec(session_rate_per_min=rate)),
                              profile, "dram", progress=False))
             for rate in (2, 4, 8, 16)]
    assert fills == sorted(fills, reverse=True) and math.isfinite(fills[0])


def test_flash_tier_stages_and_reads(profile, workload) -> None:
    result = simulate(workload, profile, "flash", progress=False)
    last = result.samples.iloc[-1]
    assert last.staging_bytes_used == last.staging_capacity_bytes  # the small buffer fills
    assert last.flash_bytes_written >= last.flash_bytes_used > last.staging_capacity_bytes
    assert last.flash_bytes_read > 0 and result.records.loaded_tokens_flash.sum() > 0
    assert np.all(np.diff(result.samples.time_s) >= 0)


def test_synchronous_loads_hold_the_step(profile, workload) -> None:
    sync = profile.model_copy(deep=True)
    sync.tiers["flash"].lmcache.enable_async_loading = False
    assert not sync.tiers["flash"].load_async
    result = simulate(workload, sync, "flash", progress=False)
    r = result.records
    _accounted(result)
    loaded = r[r.load_s > 0]
    assert len(loaded) and (loaded.first_token_s - loaded.send_s >= loaded.load_s).all()


def test_mooncake_trace_replay(profile) -> None:
    path = MOONCAKE / "conversation_trace.jsonl"
    if not path.is_file():
        pytest.skip(f"Mooncake trace not found at {path} (shared data not mounted)")
    trace = read_mooncake_trace(path)
    # replayed at half speed so the tiny server keeps up: a queued request cannot hit a
    # prefix that an earlier request has not computed yet
    workload = trace_to_workload(trace, max_requests=1000, time_scale=2.0)
    big = _with_dram(profile, 50e9)
    big.server.max_model_len = 131_072
    big.server.kv_cache_bytes = 256 * 2**20
    result = simulate(workload, big, "dram", progress=False)
    _accounted(result)
    # what an unbounded cache could hit: each request's leading trace blocks seen before
    seen, ideal = set(), 0
    for ids, length in zip(workload.turns.hash_ids, workload.turns.prompt_tokens, strict=True):
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        ideal += min(k * 512, length - 1)
        seen.update(ids)
    assert result.stats["failed"] == 0
    assert result.records.cached_prompt_tokens.sum() >= 0.7 * ideal > 0


def test_profile_path_duration_and_progress_bar(workload) -> None:
    result = simulate(workload, PROFILE_PATH, "baseline", duration_s=60.0, progress=True)
    assert result.records.send_s.max() < 60.0
    assert result.stats["turns_not_sent"] > 0
    _accounted(result)


def _most_in_flight(records: pd.DataFrame) -> int:
    """Largest number of requests between send and finish at any moment."""
    events = pd.concat([pd.Series(1, index=records.send_s), pd.Series(-1, index=records.finish_s)])
    return int(events.groupby(level=0).sum().sort_index().cumsum().max())


def test_client_concurrency_limit(profile, workload) -> None:
    free = simulate(workload, profile, "dram", progress=False)
    assert _most_in_flight(free.records) > 2
    capped = simulate(workload, profile, "dram", max_in_flight=2, progress=False)
    _accounted(capped)
    assert _most_in_flight(capped.records) <= 2
    s = capped.stats
    assert s["arrived"] + s["turns_not_sent"] == len(workload.turns)
    assert s["client_waiting_at_end"] == 0 and s["unfinished"] == 0
    # a limit nobody reaches changes nothing
    loose = simulate(workload, profile, "dram", max_in_flight=10_000, progress=False)
    pd.testing.assert_frame_equal(free.records, loose.records)
    with pytest.raises(ValueError, match="max_in_flight"):
        simulate(workload, profile, "dram", max_in_flight=0, progress=False)
