"""Step time from the roofline functions, and the scheduler's steps for hand-built cases."""

from __future__ import annotations

import math

import pytest

from kvrepro.calc.roofline import decode_step_s, prefill_time_s
from kvrepro.engines.sim import SimProfile, simulate
from kvrepro.engines.sim.steptime import StepTimer
from kvrepro.workload import MicrobenchSpec, microbenchmark


def test_step_time_is_the_roofline_of_the_step(profile: SimProfile) -> None:
    server = profile.server
    timer = StepTimer(server)
    model, gpu = server.model_spec(), server.gpu_spec()
    chunks = [(2048, 0), (512, 4096)]
    kv_tokens = 2048 + 4096 + 512 + 30 * 3000
    compute_s = (prefill_time_s(model, gpu, 2048, 0, server.mfu)
                 + prefill_time_s(model, gpu, 512, 4096, server.mfu))
    memory_s = decode_step_s(model, gpu, kv_tokens) / server.decode_efficiency
    assert timer.compute_s(chunks) == pytest.approx(compute_s)
    assert timer.memory_s(kv_tokens) == pytest.approx(memory_s)
    assert timer.step_s(chunks, kv_tokens) == pytest.approx(
        max(compute_s, memory_s) + server.step_overhead_s)
    assert timer.step_s([], 100, wait_s=0.25) == pytest.approx(
        decode_step_s(model, gpu, 100) / server.decode_efficiency
        + server.step_overhead_s + 0.25)


def _one_prompt(prompt_tokens: int, output_tokens: int):
    return microbenchmark(MicrobenchSpec(prompt_lengths=[prompt_tokens], prompts_per_length=1,
                                         output_tokens=output_tokens, gap_s=1.0,
                                         round_gap_s=100.0))


def test_chunked_prefill_then_decode_times(profile: SimProfile) -> None:
    """A 3,000-token prompt with a 2,048-token budget: two prefill chunks, then decodes."""
    timer = StepTimer(profile.server)
    result = simulate(_one_prompt(3000, 4), profile, "baseline", progress=False)
    fill = result.records.iloc[0]
    step1 = timer.step_s([(2048, 0)], 2048)
    step2 = timer.step_s([(952, 2048)], 3000)
    assert fill.first_token_s == pytest.approx(step1 + step2)
    decode = sum(timer.step_s([], 3000 + k) for k in (1, 2, 3))
    assert fill.finish_s == pytest.approx(step1 + step2 + decode)
    assert fill.cached_prompt_tokens == 0 and fill.recomputed_tokens == 3000
    assert fill.output_tokens == 4


def test_repeated_prompt_hits_all_but_the_last_block(profile: SimProfile) -> None:
    result = simulate(_one_prompt(3000, 4), profile, "baseline", progress=False)
    measure = result.records.iloc[1]
    hit = (3000 - 1) // 16 * 16
    assert measure.cached_prompt_tokens == hit == measure.gpu_hit_tokens
    timer = StepTimer(profile.server)
    assert measure.first_token_s - measure.send_s == pytest.approx(
        timer.step_s([(3000 - hit, hit)], 3000))


def test_offload_hit_costs_a_load(profile: SimProfile) -> None:
    """GPU too small to keep the prompt across the fill round: the DRAM tier serves it."""
    small = profile.model_copy(deep=True)
    small.server.kv_cache_bytes = 8192 * 2048  # exactly max_model_len
    spec = MicrobenchSpec(prompt_lengths=[4096], prompts_per_length=3, output_tokens=2,
                          gap_s=5.0, round_gap_s=10.0)
    result = simulate(microbenchmark(spec), small, "dram", progress=False)
    measure = result.records[result.records.session_id >= 3]
    first = measure.iloc[0]  # evicted from the GPU by the later fill prompts
    assert first.gpu_hit_tokens < 4096 // 2
    assert first.loaded_tokens_dram > 0
    assert first.cached_prompt_tokens == first.gpu_hit_tokens + first.loaded_tokens_dram
    tier = small.tier("dram").stores[0]
    chunk_bytes = tier.chunk_tokens * 2048
    chunks = math.ceil((first.cached_prompt_tokens - first.gpu_hit_tokens) / tier.chunk_tokens)
    assert first.load_s == pytest.approx(chunks * chunk_bytes / tier.read_bw_bytes_s)


def test_preemption_recomputes_and_still_finishes(profile: SimProfile) -> None:
    """Two long generations that cannot both fit: the newer one is preempted, not lost."""
    small = profile.model_copy(deep=True)
    small.server.kv_cache_bytes = 8192 * 2048
    spec = MicrobenchSpec(prompt_lengths=[3000], prompts_per_length=2, output_tokens=2000,
                          gap_s=0.01, round_gap_s=1000.0)
    result = simulate(microbenchmark(spec), small, "baseline", duration_s=1.0, progress=False)
    assert result.stats["preemptions"] > 0
    assert len(result.records) == 2 and (result.records.output_tokens == 2000).all()
    assert result.records.preemptions.sum() == result.stats["preemptions"]
    assert result.records.recomputed_tokens.max() > 3000
