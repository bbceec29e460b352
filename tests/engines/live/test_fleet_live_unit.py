"""The live fleet without vLLM: instance tiers, commands, routing, attribution, the summary.

What the live test (tests/engines/live/test_fleet_live.py) cannot afford to vary: every tier and
command detail, the client's session header and served-model attribution against fake
instances, the client-side routing, and `fleet_live_summary` on hand-built records whose
numbers are worked out here by hand.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from aiohttp import web

from kvrepro.analysis.fleet_live import FLEET_COLUMNS, fleet_live_summary
from kvrepro.engines.live.client import run_workload
from kvrepro.engines.live.fleet_deploy import (
    SESSION_HEADER,
    ClientRouting,
    FleetRecords,
    fleet_grid,
    fleet_tiers,
    override_fleet,
    router_command,
    run_name,
    shared_pool_tier,
)
from kvrepro.engines.live.placement import vllm_env
from kvrepro.engines.live.server import with_free_ports
from kvrepro.engines.live.tiers import live_tier, lmcache_server_args, server_args
from kvrepro.fleet_spec import shipped_fleet
from kvrepro.records import RunWriter, read_run
from kvrepro.tier_spec import Placement
from tests.engines.live.test_live_client import config, small_workload


def _fleet(**update: Any):
    return shipped_fleet("cpu_tiny_2x").model_copy(update=update)


# --------------------------------------------------------------------------- tiers


def test_shared_instances_have_own_ports_and_names_and_the_pools_lmcache() -> None:
    fleet = _fleet(kv_pool="shared", tier="dram")
    pool = with_free_ports(shared_pool_tier(fleet))
    tiers = fleet_tiers(fleet, pool)
    assert [t.port for t in tiers] == [fleet.base_port, fleet.base_port + 1]
    assert [t.served_model_name for t in tiers] == ["tiny-i0", "tiny-i1"]
    for t in tiers:
        assert t.lmcache_mp.port == pool.lmcache_mp.port
        args = server_args(t)
        at = args.index("--served-model-name")
        assert args[at + 1:at + 3] == [t.served_model_name, "tiny"]
        assert args[args.index("--port") + 1] == str(t.port)
    # the pool runs the single server's LMCache command line: same flags, same sizes
    single = live_tier(fleet.server_spec(), "dram")
    single = single.model_copy(update={"lmcache_mp": pool.lmcache_mp})
    assert lmcache_server_args(pool) == lmcache_server_args(single)


def test_shared_fleet_needs_its_pool() -> None:
    with pytest.raises(ValueError, match="shared pool"):
        fleet_tiers(_fleet(kv_pool="shared"))


def test_private_flash_pools_get_their_own_folders() -> None:
    fleet = _fleet(kv_pool="private", tier="flash")
    assert shared_pool_tier(fleet) is None
    tiers = fleet_tiers(fleet)
    (root,) = [f.path.rstrip("/") for f in live_tier(fleet.server_spec(), "flash").folders]
    assert [[f.path for f in t.folders] for t in tiers] == [[f"{root}/i0"], [f"{root}/i1"]]
    for t in tiers:
        assert [a["base_path"] for a in t.lmcache_mp.l2_adapters] == [t.folders[0].path]
        assert t.lmcache_mp.port is None  # each VllmServer picks its own LMCache ports


def _shared_fs_fleet(tmp_path: Path, share: str | None, **update: Any):
    """A private-pool fleet of the tiny server's `shared` tier: a small L1, a flash store and
    a shared filesystem store (in `share`, or the default in the fleet's run folder)."""
    from tests.engines.live.conftest import SHARED_TIER, shared_fs_server, write_server

    spec = shared_fs_server(share or "unset")
    tree = spec.model_dump(mode="json")
    stores = tree["tiers"][SHARED_TIER]["stores"]
    if share is None:
        stores[1].pop("path")
    flash = spec.tier("flash").stores[1].model_dump(mode="json")
    tree["tiers"][SHARED_TIER]["stores"] = [stores[0], {**flash, "io_mode": "buffered"},
                                            stores[1]]
    path = write_server(type(spec).model_validate(tree), tmp_path / "server.yaml")
    return _fleet(server=str(path), tier=SHARED_TIER, kv_pool="private", **update)


def test_private_pools_share_the_shared_stores_folder_and_keep_their_own(
        tmp_path: Path) -> None:
    """A shared_fs store is one folder for every instance (the fleet's, `{run_dir}` being the
    fleet's run folder); a flash store's folder is each instance's own sub-folder."""
    fleet = _shared_fs_fleet(tmp_path, None)
    run = tmp_path / "fleet"
    tiers = fleet_tiers(fleet, run_dir=run)
    share = str((run / "shared-fs").resolve())
    for i, t in enumerate(tiers):
        flash, shared = t.folders
        assert (flash.shared, shared.shared) == (False, True)
        assert flash.path == f"{{run_dir}}/lmcache-l2/i{i}" and shared.path == share
        assert [a["base_path"] for a in t.lmcache_mp.l2_adapters] == [flash.path, share]
    given = fleet_tiers(_shared_fs_fleet(tmp_path, str(tmp_path / "nfs")), run_dir=run)
    assert {t.folders[1].path for t in given} == {str(tmp_path / "nfs")}


def test_the_fleet_owns_a_shared_folder_once(tmp_path: Path) -> None:
    """One DiskFolder for the shared store's folder, the deployment's; each instance owns
    only its own flash folder (a second lock on the shared one would refuse the run)."""
    from kvrepro.engines.live.fleet_deploy import FleetDeployment

    fleet = _shared_fs_fleet(tmp_path, str(tmp_path / "share"))
    deployment = FleetDeployment(fleet, tmp_path / "fleet", python="/bin/true", router="client")
    shared = deployment._new_shared_folders()
    assert [(d.path, d.label) for d in shared.disks] == [(tmp_path / "share", "shared folder")]
    servers = deployment._instances()
    assert [[d.label for d in s.disks] for s in servers] == [["flash folder"]] * 2
    assert {s.tier.folders[1].path for s in servers} == {str(tmp_path / "share")}
    shared.start()
    try:
        (tmp_path / "share" / "k.data").write_text("a chunk an instance wrote")
        (tmp_path / "share" / "notes.txt").write_text("not a chunk: left alone")
    finally:
        shared.stop()
    assert shared.cleaned["disk_files"] == 1
    assert sorted(p.name for p in (tmp_path / "share").iterdir()) == ["notes.txt"]


def test_pinning_binds_instance_i_to_one_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    tiers = fleet_tiers(_fleet(kv_pool="private", n_servers=3), pin_cpus=True)
    assert [vllm_env(t.placement) for t in tiers] == [
        {"VLLM_CPU_OMP_THREADS_BIND": c} for c in ("0", "1", "0")]
    for t in tiers:  # the same rule for each: its front end off its own engine CPU
        engine, front = t.placement.cpus("engine"), t.placement.cpus("front")
        assert len(engine) == 1 and front == {0, 1} - engine
        assert all(t.placement.cpus(r) == {0, 1} for r in ("lmcache", "client", "router"))
    single = live_tier(_fleet().server_spec(), "dram").placement
    assert single.engine_cpus == "0"  # what every instance would get without the rule
    unpinned = fleet_tiers(_fleet(kv_pool="private"))
    assert all(t.placement == Placement() and not vllm_env(t.placement) for t in unpinned)


def test_the_shared_pool_runs_on_the_instances_shared_cpus(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    fleet = _fleet(kv_pool="shared", tier="dram")
    assert shared_pool_tier(fleet, pin_cpus=True).placement.cpus("lmcache") == {0, 1}
    assert shared_pool_tier(fleet).placement == Placement()


def test_router_command_and_run_names() -> None:
    cmd = router_command(["http://127.0.0.1:1", "http://127.0.0.1:2"], "consistent_hash",
                         "127.0.0.1", 8500, "/venv/bin/python")
    assert cmd[0] == "/venv/bin/vllm-router"
    assert cmd[1:] == ["--worker-urls", "http://127.0.0.1:1", "http://127.0.0.1:2", "--policy",
                       "consistent_hash", "--host", "127.0.0.1", "--port", "8500"]
    grid = fleet_grid(_fleet(), ["round_robin", "prefix_aware"], ["shared", "private"])
    assert [run_name(f) for f in grid] == [
        "shared-dram-round_robin", "shared-dram-prefix_aware",
        "private-dram-round_robin", "private-dram-prefix_aware"]


@pytest.mark.skipif(importlib.util.find_spec("vllm_router") is None,
                    reason="vllm-router not installed (make live-cpu)")
def test_router_command_parses_with_the_routers_own_arguments() -> None:
    import argparse

    from vllm_router.router_args import RouterArgs

    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser)
    cmd = router_command(["http://127.0.0.1:1", "http://127.0.0.1:2"], "cache_aware",
                         "127.0.0.1", 8500, prometheus_port=8600)
    parsed = parser.parse_args(cmd[1:])
    assert parsed.worker_urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert (parsed.policy, parsed.port, parsed.prometheus_port) == ("cache_aware", 8500, 8600)


def test_overrides_are_checked() -> None:
    fleet = _fleet()
    assert override_fleet(fleet, {"routing": "prefix_aware"}).routing == "prefix_aware"
    with pytest.raises(ValueError, match="routing"):
        override_fleet(fleet, {"routing": "random"})
    with pytest.raises(ValueError, match="nope"):
        override_fleet(fleet, {"tier": "nope"})
    with pytest.raises(ValueError, match="colour"):
        override_fleet(fleet, {"colour": 1})


# --------------------------------------------------------------------------- attribution


class _ListWriter:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write_record(self, record: dict[str, Any]) -> None:
        self.records.append(record)


def test_records_name_the_instance_and_whether_the_turn_moved() -> None:
    sink = _ListWriter()
    writer = FleetRecords(sink, ["m-i0", "m-i1"], {"kv_pool": "shared", "routing": "x"})
    served = [(1, "m-i0"), (2, "m-i1"), (1, "m-i0"), (1, "m-i1"), (2, ""), (1, "m-i1"),
              (1, "m-i0")]
    for sid, name in served:
        writer.write_record({"session_id": sid, "served_model": name})
    got = [(r["instance"], r["routed_away"]) for r in sink.records]
    assert got == [(0, False), (1, False), (0, False), (1, True), (-1, False), (1, False),
                   (0, True)]
    assert all(r["kv_pool"] == "shared" for r in sink.records)


def test_client_routing_round_robin_and_session_affinity() -> None:
    rr = ClientRouting(None, config("http://x"), ["http://a", "http://b"], "round_robin")
    assert [rr.pick(7) for _ in range(5)] == [0, 1, 0, 1, 0]
    sa = ClientRouting(None, config("http://x"), ["http://a", "http://b"], "session_affinity")
    picks = {sid: {sa.pick(sid) for _ in range(4)} for sid in range(40)}
    assert all(len(p) == 1 for p in picks.values())  # every turn of a session: one instance
    assert {next(iter(p)) for p in picks.values()} == {0, 1}  # sessions are spread
    with pytest.raises(ValueError, match="prefix_aware"):
        ClientRouting(None, config("http://x"), ["http://a"], "prefix_aware")


class _Instance:
    """A fake vLLM instance: answers with its own model name, notes the session header."""

    def __init__(self, name: str) -> None:
        self.name, self.sessions, self.url = name, [], ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.sessions.append(request.headers.get(SESSION_HEADER))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        ids = [40_000 + j for j in range(body["max_tokens"])]
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids),
                 "prompt_tokens_details": {"cached_tokens": 0}}
        for chunk in ({"model": self.name, "choices": [{"text": "x", "token_ids": ids}]},
                      {"model": self.name, "choices": [], "usage": usage}):
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return runner


def test_client_sends_session_ids_and_records_who_answered(tmp_path: Path) -> None:
    import aiohttp

    wl = small_workload(6)
    instances = [_Instance("m-i0"), _Instance("m-i1")]

    async def go() -> None:
        runners = [await inst.start() for inst in instances]
        try:
            cfg = config("http://unused", session_header=SESSION_HEADER,
                         record_served_model=True)
            with RunWriter(tmp_path, {"engine": "live"}) as writer:
                async with aiohttp.ClientSession() as session:
                    routing = ClientRouting(session, cfg, [i.url for i in instances],
                                            "round_robin")
                    await run_workload(wl, FleetRecords(writer, ["m-i0", "m-i1"], {}), cfg,
                                       transport=routing)
        finally:
            for runner in runners:
                await runner.cleanup()

    asyncio.run(go())
    records = read_run(tmp_path).records
    assert len(records) == len(wl.turns)
    sent_to = {i: inst.sessions for i, inst in enumerate(instances)}
    for i in (0, 1):  # each instance saw exactly the requests attributed to it
        mine = records[records.instance == i]
        assert sorted(sent_to[i]) == sorted(str(s) for s in mine.session_id)
    moved = records.sort_values(["session_id", "turn"]).groupby("session_id").instance
    expected = moved.transform(lambda s: (s != s.shift()) & s.shift().notna())
    assert (records.sort_values(["session_id", "turn"]).routed_away == expected).all()
    assert records.routed_away.any()  # round robin moves some sessions


# --------------------------------------------------------------------------- the summary


def _rec(sid: int, turn: int, instance: int, away: bool, send: float, first: float,
         finish: float, prompt: int, cached: float, out: int, **kw: Any) -> dict[str, Any]:
    return {"session_id": sid, "turn": turn, "tier": "dram", "engine": "live",
            "send_s": send, "first_token_s": first, "finish_s": finish,
            "prompt_tokens": prompt, "cached_prompt_tokens": cached, "output_tokens": out,
            "is_resume": False, "is_warmup": kw.get("warmup", False),
            "error": kw.get("error", ""), "instance": instance, "routed_away": away,
            "kv_pool": "shared", "routing": "round_robin"}


def test_summary_per_instance_and_total_by_hand() -> None:
    records = pd.DataFrame([
        _rec(0, 0, 0, False, 0.0, 0.5, 1.0, 100, 0, 10, warmup=True),  # warm-up: left out
        _rec(0, 1, 1, True, 2.0, 2.2, 3.0, 200, 150, 20),
        _rec(1, 0, 0, False, 2.0, 2.4, 4.0, 300, 0, 30),
        _rec(1, 1, 0, False, 5.0, 5.1, 12.0, 400, 300, 40),
        _rec(2, 0, 1, False, 6.0, 7.0, 7.0, 100, 0, 0, error="boom"),  # failed
    ])
    samples = pd.DataFrame([
        {"time_s": 0.0, "instance": 0, "prompt_tokens_local_compute": 0.0,
         "prompt_tokens_local_cache_hit": 0.0, "prompt_tokens_external_kv_transfer": 0.0},
        {"time_s": 12.0, "instance": 0, "prompt_tokens_local_compute": 400.0,
         "prompt_tokens_local_cache_hit": 100.0, "prompt_tokens_external_kv_transfer": 200.0},
        {"time_s": 0.0, "instance": 1, "prompt_tokens_local_compute": 0.0,
         "prompt_tokens_local_cache_hit": 0.0, "prompt_tokens_external_kv_transfer": 0.0},
        {"time_s": 12.0, "instance": 1, "prompt_tokens_local_compute": 50.0,
         "prompt_tokens_local_cache_hit": 0.0, "prompt_tokens_external_kv_transfer": 150.0},
        {"time_s": 12.0, "instance": -1, "lmcache_l1_hit_tokens": 9.0},
    ])
    table = fleet_live_summary(records, samples).set_index("instance")
    assert sorted(table.reset_index().columns) == sorted(FLEET_COLUMNS)
    # window: first measured send 2.0 to last measured finish 12.0
    assert table.window_s.tolist() == [10.0, 10.0, 10.0]
    assert table.at["0", "throughput_tok_s"] == pytest.approx((300 + 30 + 400 + 40) / 10)
    assert table.at["1", "throughput_tok_s"] == pytest.approx((200 + 20) / 10)
    assert table.at["total", "throughput_tok_s"] == pytest.approx(99.0)
    assert table.at["0", "ttft_median_s"] == pytest.approx((0.4 + 0.1) / 2)
    assert table.at["total", "ttft_median_s"] == pytest.approx(0.2)
    assert table.at["total", "cached_share"] == pytest.approx(450 / 900)
    assert table.at["total", "routed_away_turns"] == 1
    assert table.at["total", "cross_instance_hit_share"] == pytest.approx(150 / 200)
    assert pd.isna(table.at["0", "cross_instance_hit_share"])  # no routed-away turn there
    assert (table.at["1", "n_failed"], table.at["total", "n_failed"]) == (1, 1)
    assert table.at["0", "offload_share"] == pytest.approx(200 / 700)
    assert table.at["total", "offload_hit_tokens"] == 350.0
    assert table.at["total", "offload_share"] == pytest.approx(350 / 900)


def test_summary_refuses_records_without_fleet_columns() -> None:
    records = pd.DataFrame([_rec(0, 0, 0, False, 0, 1, 2, 10, 0, 1)]).drop(columns="instance")
    with pytest.raises(ValueError, match="instance"):
        fleet_live_summary(records)


def test_a_busy_router_port_fails_before_anything_starts(tmp_path: Path) -> None:
    import socket

    from kvrepro.engines.live.fleet_deploy import FleetDeployment
    from kvrepro.engines.live.processes import ServerError

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        fleet = _fleet(router_port=busy.getsockname()[1])
        python = tmp_path / "bin" / "python"
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "vllm-router").write_text("#!/bin/sh\n")
        deployment = FleetDeployment(fleet, tmp_path / "run", python=str(python))
        with pytest.raises(ServerError, match="router_port"):
            with deployment:
                pass
    assert deployment.pool is None and deployment.instances == []


def test_a_missing_router_says_how_to_install_it(tmp_path: Path) -> None:
    from kvrepro.engines.live.fleet_deploy import FleetDeployment
    from kvrepro.engines.live.processes import ServerError

    deployment = FleetDeployment(_fleet(), tmp_path / "run", python=str(tmp_path / "python"))
    with pytest.raises(ServerError, match="pip install vllm-router==0.1.17"):
        deployment.start()
    assert deployment.instances == []


def test_cli_run_fleet_rejects_a_bad_override_before_starting(capsys, tmp_path: Path) -> None:
    from kvrepro.cli import main

    code = main(["run", "fleet", "--fleet", "data/fleets/cpu_tiny_2x.yaml", "-p",
                 "kv_pool=everywhere", "--out", str(tmp_path / "out")])
    assert code == 2
    assert "kv_pool" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _write_two_turn_run(run_dir: Path, sample: bool = False) -> None:
    """A private-pool fleet run folder: one session, its second turn routed away."""
    meta = {"kind": "fleet", "kv_pool": "private", "tier": "dram", "routing": "round_robin",
            "router": {"kind": "client"}, "options": {"warmup_s": 0.0}}
    with RunWriter(run_dir, meta) as writer:
        for rec in (_rec(0, 0, 0, False, 0.0, 0.1, 1.0, 100, 0, 10),
                    _rec(0, 1, 1, True, 1.0, 1.3, 2.0, 200, 100, 10)):
            writer.write_record({**rec, "kv_pool": "private"})
        if sample:
            writer.write_sample({"time_s": 0.0, "instance": 0})


def test_summary_reads_a_fleet_run_folder(tmp_path: Path) -> None:
    _write_two_turn_run(tmp_path / "run", sample=True)
    table = fleet_live_summary(tmp_path).set_index("instance")
    assert table.at["total", "router"] == "client"
    assert table.at["total", "cross_instance_hit_share"] == pytest.approx(0.5)
    assert table.at["total", "throughput_tok_s"] == pytest.approx(320 / 2.0)


def test_preregistered_score_compares_the_committed_file(tmp_path: Path) -> None:
    from kvrepro.studies.fleet_study import preregistered_fleet_score

    _write_two_turn_run(tmp_path / "run")
    with pytest.raises(FileNotFoundError, match="predictions.csv"):
        preregistered_fleet_score(tmp_path)
    # live TTFT 0.1 s on instance 0 and 0.3 s on instance 1 (total median 0.2 s); total
    # throughput 320 tokens over the 2 s window; the same prediction for both rows
    predicted = pd.DataFrame([
        {"kv_pool": "private", "tier": "dram", "routing": "round_robin", "instance": inst,
         "throughput_tok_s": 160.0, "ttft_median_s": 0.2, "ttft_p90_s": 0.3,
         "cached_share": 0.5, "cross_instance_hit_share": 0.5}
        for inst in ("0", "total")])
    predicted.to_csv(tmp_path / "predictions.csv", index=False)
    score = preregistered_fleet_score(tmp_path).set_index(["tier", "metric"])
    assert score.at[("total", "throughput_tok_s"), "error"] == pytest.approx(0.0)
    assert score.at[("instance 0", "ttft_median_s"), "error"] == pytest.approx(100.0)
    assert score.at[("total", "cached_share"), "error_unit"] == "pp"
    assert len(score) == 2 * 5
