"""One server spec, three renderings: the live engine, the simulator and the cost model agree.

Each check reads a rendered value back in its consumer's own terms (LMCache's GiB, vLLM's
per-GPU KV budget, the cost model's GB) and compares it with the spec, so a renderer that
drops, rescales or defaults a value differently fails here.
"""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

import pytest
import yaml

from kvrepro.calc import economics
from kvrepro.engines.live.server import with_free_ports
from kvrepro.engines.live.tiers import RUN_DISK_DIR, live_tiers, lmcache_config, server_command
from kvrepro.engines.sim import load_profile, sim_profile, simulate
from kvrepro.studies.economics_quotes import study_a_tiers
from kvrepro.tier_spec import load_server, override_server, shipped_server
from kvrepro.workload import AgenticSpec, generate_agentic

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "data" / "servers").glob("*.yaml"))
GIB = 2**30


def _flag(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_the_shipped_servers_are_there() -> None:
    assert {p.stem for p in SPECS} == {"study_a", "study_b", "cpu_tiny", "gpu_tiny"}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_spec_renders_consistently_for_both_engines_and_the_bill(path: Path) -> None:
    spec = load_server(path)
    sim, live = load_profile(path), live_tiers(spec)
    bills = economics.server_hardware(spec)
    assert set(sim.tiers) == set(live) == set(bills) == set(spec.tiers)
    for name, tier in spec.tiers.items():
        cmd = server_command(with_free_ports(live[name]), python="python", model_path="m")
        tp = int(_flag(cmd, "--tensor-parallel-size"))
        kv_per_gpu = int(_flag(cmd, "--kv-cache-memory-bytes"))
        server = sim.server_for(name)
        assert kv_per_gpu * tp == pytest.approx(server.kv_cache_bytes, rel=1e-9), name
        assert int(_flag(cmd, "--max-model-len")) == server.max_model_len
        assert int(_flag(cmd, "--max-num-batched-tokens")) == server.max_num_batched_tokens
        assert int(_flag(cmd, "--max-num-seqs")) == server.max_num_seqs
        sim_tier, bill, cfg = sim.tiers[name], bills[name], lmcache_config(live[name])
        sim_bytes = {s.name: s.capacity_bytes for s in sim_tier.stores}
        assert sim_bytes == {s.name: s.capacity_bytes for s in tier.stores}
        dram = [s for s in tier.stores if s.kind == "dram"]
        flash = [s for s in tier.stores if s.kind == "flash"]
        assert bill.dram_gb * 1e9 == pytest.approx(sum(s.capacity_bytes for s in dram))
        assert bill.drives == sum(s.drives for s in flash)
        if live[name].lmcache_mp is not None:
            _check_multi_process(with_free_ports(live[name]), sim_tier, dram, flash)
        elif cfg is None:
            assert not tier.stores, name
        else:
            _check_in_process(cfg, sim_tier, dram, flash)


def _check_in_process(cfg: dict, sim_tier, dram: list, flash: list) -> None:
    """LMCache's YAML (GiB) against the simulator's stores and flags."""
    assert {s.chunk_tokens for s in sim_tier.stores} == {cfg["chunk_size"]}
    assert cfg["local_cpu"] is bool(dram)
    sim_bytes = {s.name: s.capacity_bytes for s in sim_tier.stores}
    if dram:
        assert sim_bytes[dram[0].name] == pytest.approx(cfg["max_local_cpu_size"] * GIB)
    if flash:
        assert sim_bytes[flash[0].name] == pytest.approx(cfg["max_local_disk_size"] * GIB)
        assert cfg["local_disk"] == f"file://{(flash[0].path or RUN_DISK_DIR).rstrip('/')}/"
    assert cfg["enable_async_loading"] is sim_tier.load_async
    assert cfg["save_decode_cache"] is sim_tier.lmcache.save_decode_cache


def _check_multi_process(tier, sim_tier, dram: list, flash: list) -> None:
    """The `lmcache server` command, read by LMCache's own parser, against the simulator."""
    import json

    from kvrepro.engines.live.lmcache_keys import check_lmcache_server_args
    from kvrepro.engines.live.tiers import lmcache_server_args

    args = check_lmcache_server_args(lmcache_server_args(tier))
    sim_bytes = {s.name: s.capacity_bytes for s in sim_tier.stores}
    assert {s.chunk_tokens for s in sim_tier.stores} == {args.chunk_size}
    assert sim_bytes[dram[0].name] == pytest.approx(args.l1_size_gb * GIB)
    assert (args.l2_store_policy == "skip_l1") is sim_tier.skip_l1
    adapters = [json.loads(a) for a in args.l2_adapter]
    assert len(adapters) == len(flash)
    for adapter, store in zip(adapters, flash, strict=True):
        assert sim_bytes[store.name] == pytest.approx(adapter["max_capacity_gb"] * GIB)
        assert adapter["base_path"] == (store.path or RUN_DISK_DIR)
        assert adapter["use_odirect"] is (store.io_mode == "o_direct")
    # the multi-process connector answers lookups later and always loads asynchronously
    # (lmcache_mp_connector.get_num_new_matched_tokens); decode KV is not saved by default
    assert sim_tier.load_async is True and sim_tier.lookup_async is True
    assert sim_tier.lmcache.save_decode_cache is False
    assert all(s.async_eviction for s in sim_tier.stores)  # MP's eviction loop


def _without_lmcache_flags(spec):
    """`spec` with every tier's LMCache flags left at LMCache's defaults (the shipped study-A
    spec sets the load mode its calibration chose)."""
    tree = spec.model_dump()
    for tier in tree["tiers"].values():
        tier.pop("lmcache", None)
    return type(spec).model_validate(tree)


def test_lmcache_defaults_reach_both_engines() -> None:
    spec = _without_lmcache_flags(shipped_server("study_a"))
    cfg = lmcache_config(live_tiers(spec)["flash"])
    tier = sim_profile(spec).tiers["flash"]
    # LMCache 0.5.6's own defaults (kvrepro.engines.live.lmcache_keys.LMCACHE_KEYS)
    from kvrepro.engines.live.lmcache_keys import LMCACHE_KEYS

    for key, sim_value in (("enable_async_loading", tier.load_async),
                           ("save_decode_cache", tier.lmcache.save_decode_cache)):
        assert LMCACHE_KEYS[key][1] == "False" and cfg[key] is False and sim_value is False
    on = override_server(spec, {"tiers.flash.lmcache.enable_async_loading": True})
    assert lmcache_config(live_tiers(on)["flash"])["enable_async_loading"] is True
    assert sim_profile(on).tiers["flash"].load_async is True


def test_dram_gb_what_if_reaches_the_simulator_the_server_and_the_bill() -> None:
    spec = override_server(shipped_server("study_a"), {"dram_gb": 1024})
    assert sim_profile(spec).tiers["dram"].stores[0].capacity_bytes == 1024e9
    cfg = lmcache_config(live_tiers(spec)["dram"])
    assert cfg["max_local_cpu_size"] * GIB == pytest.approx(1024e9)
    assert study_a_tiers(spec)["dram"].dram_gb == pytest.approx(1024)
    assert study_a_tiers()["dram"].dram_gb == pytest.approx(512)
    prices = economics.load_prices()
    bill = economics.ServerBill()
    cost = economics.cost_table(study_a_tiers(spec), bill, prices).set_index("tier")
    base = economics.cost_table(study_a_tiers(), bill, prices).set_index("tier")
    assert cost.at["dram", "tier_capex_usd"] == pytest.approx(
        2 * base.at["dram", "tier_capex_usd"])
    assert cost.at["flash", "tier_capex_usd"] == base.at["flash", "tier_capex_usd"]


def _numbers(node: object, key: str = "") -> list[tuple[str, float]]:
    """(key, value) of every number in a YAML tree (PyYAML reads 512.0e9 as a string)."""
    if isinstance(node, dict):
        return [kv for k, v in node.items() for kv in _numbers(v, str(k))]
    if isinstance(node, list):
        return [kv for v in node for kv in _numbers(v, key)]
    try:
        return [] if isinstance(node, bool) else [(key, float(node))]
    except (TypeError, ValueError):
        return []


def test_study_a_capacities_are_typed_once_in_shipped_data() -> None:
    values = [kv for path in (ROOT / "data").rglob("*.yaml")
              for kv in _numbers(yaml.safe_load(path.read_text()))]
    counts = Counter(v for key, v in values if "bytes" in key or key.endswith("_gb"))
    assert counts[512e9] == 1 and counts[64e9] == 1


def _write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "my_server.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_misspelled_key_and_negative_capacity_name_the_file_and_key(tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "data" / "servers" / "study_a.yaml").read_text())
    raw["tiers"]["dram"]["stores"][0]["capacty_bytes"] = 1
    with pytest.raises(ValueError, match=r"my_server\.yaml.*key tiers\.dram\.stores\.0\."
                                         r"capacty_bytes.*Extra inputs"):
        load_server(_write(tmp_path, raw))
    raw = yaml.safe_load((ROOT / "data" / "servers" / "study_a.yaml").read_text())
    raw["tiers"]["flash"]["stores"][1]["capacity_bytes"] = -5
    with pytest.raises(ValueError, match=r"my_server\.yaml.*key tiers\.flash\.stores\.1\."
                                         r"capacity_bytes.*greater than or equal to 0"):
        load_server(_write(tmp_path, raw))
    raw = yaml.safe_load((ROOT / "data" / "servers" / "study_a.yaml").read_text())
    raw["tiers"]["flash"]["lmcache"] = {"enable_async_lodaing": True}
    with pytest.raises(ValueError, match=r"key tiers\.flash\.lmcache\.enable_async_lodaing"):
        load_server(_write(tmp_path, raw))
    with pytest.raises(ValueError, match=r"server override 'tiers.dram.stores.0.capcity'|"
                                         r"tiers\.dram\.stores\.0\.capcity"):
        override_server(shipped_server("study_a"), {"tiers.dram.stores.0.capcity": 1})


def test_a_flash_store_larger_than_its_drives_is_refused(tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "data" / "servers" / "study_a.yaml").read_text())
    raw["tiers"]["flash"]["stores"][1]["capacity_bytes"] = 60e12  # 8 x 12.8 TB RAID10: 51.2
    with pytest.raises(ValueError, match="exceeds the 8 drives' usable"):
        load_server(_write(tmp_path, raw))


def test_partial_chunks_are_refused_by_the_simulator_not_the_live_engine() -> None:
    spec = override_server(shipped_server("study_a"),
                           {"tiers.dram.lmcache.save_unfull_chunk": True})
    assert lmcache_config(live_tiers(spec)["dram"])["save_unfull_chunk"] is True
    with pytest.raises(ValueError, match="save_unfull_chunk true is not modelled"):
        sim_profile(spec)


def test_native_offload_renders_for_both_engines() -> None:
    spec = override_server(shipped_server("study_a"), {"tiers.dram.connector": "native"})
    live = live_tiers(spec)["dram"]
    cmd = server_command(live, python="python")
    assert _flag(cmd, "--kv-offloading-backend") == "native"
    assert float(_flag(cmd, "--kv-offloading-size")) * GIB == pytest.approx(512e9)
    assert sim_profile(spec).tiers["dram"].stores[0].capacity_bytes == 512e9


def test_tiny_server_renders_the_command_the_shipped_runs_used() -> None:
    live = live_tiers(shipped_server("cpu_tiny"))
    for name in ("small-kv", "large-kv"):
        shipped = shlex.split((ROOT / "data/live/cpu_tiny" / name / "command.txt").read_text())
        cmd = server_command(live[name], python=shipped[0], model_path=_flag(shipped, "--model"))
        extra = [a for a in cmd if a not in shipped]
        assert extra == ["--max-num-seqs", "256"], extra  # now explicit: the twin's limit


def _server_with(flags: dict) -> object:
    base = Path(__file__).resolve().parent / "engines" / "sim" / "profile_small.yaml"
    return override_server(load_server(base), flags)


def _flash_run(flags: dict) -> dict:
    """Bytes each store of the test server's flash tier was written, at the end of a run."""
    workload = generate_agentic(AgenticSpec(seed=1, session_rate_per_min=6, duration_s=240,
                                            context_cap_tokens=8192, idle_after_turns=50))
    result = simulate(workload, sim_profile(_server_with(flags)), "flash", progress=False)
    last = result.samples.iloc[-1]
    return {k: float(last[k]) for k in last.index if k.endswith("_bytes_written")}


def test_the_simulator_follows_save_decode_and_skip_l1() -> None:
    plain = _flash_run({})
    decode = _flash_run({"tiers.flash.lmcache.save_decode_cache": True})
    skip = _flash_run({"tiers.flash.lmcache.l2_store_policy": "skip_l1"})
    assert set(plain) == {"staging_bytes_written", "flash_bytes_written"}
    assert decode["flash_bytes_written"] > plain["flash_bytes_written"]  # decode KV stored too
    assert plain["staging_bytes_written"] > 0  # default: stores go to L1 as well
    # skip_l1: L1 gets only chunks staged by loads from L2, fewer than every computed chunk
    assert skip["staging_bytes_written"] < plain["staging_bytes_written"]
    assert skip["flash_bytes_written"] == pytest.approx(plain["flash_bytes_written"], rel=0.2)


# ------------------------------------------------------------------ layout


def test_no_two_modules_share_a_name() -> None:
    names = Counter(p.stem for p in (ROOT / "kvrepro").rglob("*.py") if p.stem != "__init__")
    assert not {n: c for n, c in names.items() if c > 1}


def test_both_engines_share_the_end_of_run_rule() -> None:
    from kvrepro import engines
    from kvrepro.engines.live.runner import LiveOptions
    from kvrepro.engines.run_result import DRAIN_TIMEOUT_S

    assert DRAIN_TIMEOUT_S is None and LiveOptions().drain_timeout_s is None
    workload = generate_agentic(AgenticSpec(seed=2, session_rate_per_min=6, duration_s=300,
                                            context_cap_tokens=8192))
    server = load_server(Path(__file__).resolve().parent / "engines" / "sim" / "profile_small.yaml")
    full = engines.run("sim", workload, server, "baseline", progress=False)
    cut = engines.run("sim", workload, server, "baseline", progress=False, drain_timeout_s=0.0)
    assert full.meta["stats"]["unfinished"] == 0  # everything sent runs to completion
    assert cut.meta["stats"]["unfinished"] > 0
    assert len(full.records) == len(cut.records) + cut.meta["stats"]["unfinished"]
    assert (cut.records.finish_s <= 300.0 + 1e-9).all()
    assert full.records.finish_s.max() > 300.0
    with pytest.raises(ValueError, match="unknown engine 'gpu'"):
        engines.run("gpu", workload, server, "baseline")


def test_multi_process_lmcache_takes_asynchronous_loads_and_refuses_what_it_cannot_set() -> None:
    from kvrepro.engines.live.tiers import live_tier

    spec = override_server(shipped_server("study_a"), {
        f"tiers.{t}.lmcache.enable_async_loading": True for t in ("dram", "flash")})
    assert live_tier(spec, "dram", "multi_process").lmcache_mp is not None  # it always does
    assert sim_profile(override_server(spec, {"live.lmcache_mode": "multi_process"})
                       ).tiers["dram"].load_async
    decode = override_server(spec, {f"tiers.{t}.lmcache.save_decode_cache": True
                                    for t in ("dram", "flash")})
    with pytest.raises(ValueError, match=r"tier 'dram': lmcache \['save_decode_cache'\] have no"):
        live_tier(decode, "dram", "multi_process")
