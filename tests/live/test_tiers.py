"""Live tiers rendered from server specs: every shipped spec renders, and every command line
passes vLLM's own parser."""

import json
from pathlib import Path

import pytest

from kvrepro.engines.live.lmcache_keys import check_lmcache_server_args, validate_lmcache_config
from kvrepro.engines.live.server import with_free_ports
from kvrepro.engines.live.tiers import (
    TierConfig,
    live_tiers,
    lmcache_config,
    lmcache_server_args,
    load_tiers,
    server_args,
)
from kvrepro.tier_spec import shipped_server
from tests.live.conftest import require_vllm

TIER_FILES = sorted((Path(__file__).resolve().parents[2] / "data" / "servers").glob("*.yaml"))


@pytest.fixture(scope="module")
def vllm_parser():
    require_vllm()
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def test_shipped_tier_files_load() -> None:
    assert {p.name for p in TIER_FILES} >= {"study_a.yaml", "cpu_tiny.yaml"}
    kinds = set()
    for path in TIER_FILES:
        tiers = load_tiers(path)
        assert tiers
        kinds |= {t.kind for t in tiers.values()}
    assert kinds == {"baseline", "dram", "flash"}
    tiny = load_tiers(TIER_FILES[[p.name for p in TIER_FILES].index("cpu_tiny.yaml")])
    assert tiny["dram"].lmcache_mp is not None and tiny["flash"].lmcache_mp is not None


def _rendered(path: Path, mode: str | None):
    return [with_free_ports(t) for t in live_tiers(shipped_server(path.stem), mode).values()]


@pytest.mark.parametrize("mode", [None, "in_process", "multi_process"])
@pytest.mark.parametrize("path", TIER_FILES, ids=lambda p: p.name)
def test_commands_pass_vllms_parser(path: Path, mode: str | None, vllm_parser) -> None:
    if mode == "in_process" and path.stem == "cpu_tiny":
        pytest.skip("in-process LMCache needs a GPU (LMCACHE_CPU.md)")
    if mode == "multi_process" and path.stem == "study_b":
        with pytest.raises(ValueError, match="multi-process LMCache needs a dram store"):
            _rendered(path, mode)  # study B's SSD tiers have no CPU copy; LMCache MP has an L1
        return
    for tier in _rendered(path, mode):
        args = vllm_parser.parse_args(server_args(tier, model_path="some/model"))
        assert args.enable_prefix_caching and args.enable_prompt_tokens_details
        assert args.port == tier.port and args.max_model_len == tier.max_model_len
        if tier.lmcache_mp is not None:
            connector = args.kv_transfer_config
            assert connector.kv_connector == "LMCacheMPConnector"
            assert connector.kv_connector_extra_config["lmcache.mp.port"] == tier.lmcache_mp.port
            parsed = check_lmcache_server_args(lmcache_server_args(tier))
            assert parsed.l1_size_gb * 2**30 == pytest.approx(
                tier.lmcache_mp.l1_size_gib * 2**30)
            assert parsed.l2_store_policy == tier.lmcache_mp.l2_store_policy
        elif tier.kind in ("dram", "flash"):
            connector = args.kv_transfer_config
            assert connector.kv_connector == "LMCacheConnectorV1"
            assert connector.kv_role == "kv_both"
        if tier.kind == "native_offload":
            assert args.kv_offloading_backend == "native"
            assert args.kv_offloading_size == pytest.approx(tier.native_offload_gib)
        if tier.kv_cache_memory_bytes:
            assert args.kv_cache_memory_bytes == tier.kv_cache_memory_bytes


def test_vllm_parser_rejects_a_bad_flag(vllm_parser) -> None:
    with pytest.raises(SystemExit):
        vllm_parser.parse_args(["--model", "m", "--kv-offloading-backend", "bogus"])


def test_lmcache_yaml_uses_lmcache_keys() -> None:
    tiers = load_tiers(TIER_FILES[[p.name for p in TIER_FILES].index("study_a.yaml")])
    dram, flash = lmcache_config(tiers["dram"]), lmcache_config(tiers["flash"])
    # the spec's flags, written explicitly: its fitted load mode, LMCache's other defaults
    flags = {"enable_async_loading": tiers["dram"].lmcache.enable_async_loading,
             "save_decode_cache": False, "save_unfull_chunk": False}
    assert dram == {"chunk_size": 256, "local_cpu": True,
                    "max_local_cpu_size": pytest.approx(476.837, abs=1e-3), **flags}
    assert flash["local_disk"] == "file:///mnt/raid10/kvrepro-lmcache/"
    assert flash["max_local_disk_size"] == pytest.approx(37252.9, abs=0.1)  # 40 TB in GiB
    assert flash["max_local_cpu_size"] == pytest.approx(59.605, abs=1e-3)  # 64 GB staging
    for cfg in (dram, flash):
        validate_lmcache_config(cfg)
    assert lmcache_config(tiers["baseline"]) is None


def _tier(**fields) -> dict:
    return {"name": "t", "model": "m", **fields}


def test_tier_errors_name_the_problem(tmp_path) -> None:
    with pytest.raises(ValueError, match="flash needs lmcache.local_disk_path"):
        TierConfig(**_tier(kind="flash", lmcache={"max_local_cpu_size_gib": 1}))
    with pytest.raises(ValueError, match="needs one 'lmcache' .* or 'lmcache_mp'"):
        TierConfig(**_tier(kind="dram"))
    with pytest.raises(ValueError, match="native_offload_gib"):
        TierConfig(**_tier(kind="native_offload"))
    bad = tmp_path / "server.yaml"
    bad.write_text("model: Qwen3-14B-BF16\nengine: {kv_cache_bytes: 1.0e9}\n"
                   "twin: {fp16_tflops: 1, mem_bw_tb_s: 1}\nlive: {model: m}\n"
                   "tiers:\n  a: {kv_cache_memroy_bytes: 1}\n")
    with pytest.raises(ValueError, match=r"server.yaml: .*key tiers\.a\.kv_cache_memroy_bytes"):
        load_tiers(bad)
    bad.write_text("tiers: [1, 2]\n")
    with pytest.raises(ValueError, match="server.yaml: invalid server spec"):
        load_tiers(bad)


def test_command_is_json_safe() -> None:
    tier = TierConfig(**_tier(kind="dram", lmcache={"max_local_cpu_size_gib": 5}))
    args = server_args(tier)
    config = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert config == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
