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
from tests.engines.live.conftest import require_vllm

TIER_FILES = sorted((Path(__file__).resolve().parents[3] / "data" / "servers").glob("*.yaml"))


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
        elif tier.lmcache is not None:
            connector = args.kv_transfer_config
            assert connector.kv_connector == "LMCacheConnectorV1"
            assert connector.kv_role == "kv_both"
        if tier.native_offload is not None:
            assert args.kv_offloading_backend == "native"
            assert args.kv_offloading_size * 2**30 == pytest.approx(
                tier.native_offload["cpu_bytes_to_use"], rel=1e-5)
        if tier.kv_cache_bytes:
            assert args.kv_cache_memory_bytes * tier.tensor_parallel_size == pytest.approx(
                tier.kv_cache_bytes, abs=tier.tensor_parallel_size)


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
    with pytest.raises(ValueError, match="needs both local_disk_path and max_local_disk_size"):
        TierConfig(**_tier(kind="flash", lmcache={"max_local_disk_size_gib": 1}))
    with pytest.raises(ValueError, match="one offload section at most"):
        TierConfig(**_tier(kind="dram", lmcache={}, native_offload={"cpu_bytes_to_use": 1}))
    with pytest.raises(ValueError, match="native_offload needs 'cpu_bytes_to_use'"):
        TierConfig(**_tier(kind="native_offload", native_offload={"secondary_tiers": []}))
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


def test_shared_fs_tiers_pass_vllms_and_lmcaches_parsers(tmp_path, vllm_parser) -> None:
    """A shared filesystem store in each of the three forms: multi-process LMCache's `fs` L2
    adapter (LMCache's server parser), in-process LMCache's `remote_url` (LMCache's own key
    list), vLLM's own offloading with an `fs` secondary tier (`TieringOffloadingSpec`, vLLM's
    parser and its spec's keys)."""
    from kvrepro.engines.live.tiers import live_tier, with_run_disk
    from tests.engines.live.conftest import SHARED_TIER, shared_fs_server

    spec = shared_fs_server(tmp_path / "share")
    mp = with_free_ports(live_tier(spec, SHARED_TIER, "multi_process"))
    parsed = check_lmcache_server_args(lmcache_server_args(mp))
    assert [json.loads(a) for a in parsed.l2_adapter] == [
        {"type": "fs", "base_path": str(tmp_path / "share")}]
    in_process = live_tier(spec, SHARED_TIER, "in_process")
    cfg = lmcache_config(in_process)
    validate_lmcache_config(cfg)
    assert cfg["remote_url"] == f"fs://{tmp_path / 'share'}" and cfg["local_cpu"] is True
    native = spec.model_dump(mode="json")
    native["tiers"][SHARED_TIER]["connector"] = "native"
    native["tiers"][SHARED_TIER]["stores"][1].pop("path")
    tier = with_run_disk(live_tier(type(spec).model_validate(native), SHARED_TIER), tmp_path)
    args = vllm_parser.parse_args(server_args(tier, model_path="some/model"))
    connector = args.kv_transfer_config
    assert connector.kv_connector == "OffloadingConnector"
    extra = connector.kv_connector_extra_config
    assert extra["spec_name"] == "TieringOffloadingSpec"
    assert extra["cpu_bytes_to_use"] == 32 * 2**20
    assert extra["secondary_tiers"] == [{"type": "fs",
                                         "root_dir": str(tmp_path.resolve() / "shared-fs")}]
    assert [f.path for f in tier.folders] == [str(tmp_path.resolve() / "shared-fs")]


def test_the_run_folder_is_filled_in_everywhere_a_setting_names_a_store_folder(
        tmp_path) -> None:
    """`{run_dir}` in a store's default folder becomes the run's folder in the folder list
    and in each setting naming it: a disk's local_disk_path, a share's fs:// URL, an L2
    adapter's base_path (`with_run_disk`); an old tier record reads back under today's
    names (`read_tier_config`)."""
    from kvrepro.engines.live.tiers import live_tier, read_tier_config, with_run_disk
    from tests.engines.live.conftest import SHARED_TIER, shared_fs_server

    tree = shared_fs_server(tmp_path).model_dump(mode="json")
    tree["tiers"][SHARED_TIER]["stores"][1].pop("path")
    spec = type(shared_fs_server(tmp_path)).model_validate(tree)
    run = tmp_path.resolve() / "run"
    for mode, setting in (("in_process", lambda t: t.lmcache.remote_url),
                          ("multi_process", lambda t: t.lmcache_mp.l2_adapters[0]["base_path"])):
        tier = with_run_disk(live_tier(spec, SHARED_TIER, mode), run)
        assert [f.path for f in tier.folders] == [f"{run}/shared-fs"]
        assert setting(tier) in (f"{run}/shared-fs", f"fs://{run}/shared-fs"), setting(tier)
    old = {"name": "f", "kind": "flash", "model": "m", "tensor_parallel_size": 4,
           "kv_cache_memory_bytes": 5_000_000_000, "disk_dir": "/mnt/x", "keep_disk_files": True,
           "allow_existing_disk_files": False, "native_offload_gib": None,
           "lmcache": {"local_disk_path": "/mnt/x", "max_local_disk_size_gib": 1.0}}
    tier = read_tier_config(old)
    assert tier.kv_cache_bytes == 20_000_000_000 and tier.kv_cache_bytes_per_gpu() == 5e9
    assert [(f.path, f.keep_files) for f in tier.folders] == [("/mnt/x", True)]
