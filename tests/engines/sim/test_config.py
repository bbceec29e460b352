"""Simulator profiles: YAML loading, checks, and errors that name the file and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvrepro.engines.sim import OffloadTier, ServerProfile, SimProfile, SimTier, load_profile
from kvrepro.engines.sim.config import capacity_chunks, server_record, tier_record
from kvrepro.model_spec import get_model
from tests.engines.sim.conftest import PROFILE_PATH


def _write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _raw() -> dict:
    return yaml.safe_load(PROFILE_PATH.read_text())


def test_test_profile_loads(profile: SimProfile) -> None:
    assert set(profile.tiers) == {"baseline", "dram", "flash"}
    assert profile.tier("flash").name == "flash"
    assert [s.name for s in profile.tier("flash").stores] == ["staging", "flash"]
    server = profile.server
    assert server.model_spec().kv_bytes_per_token == 2048
    assert server.capacity_blocks() == 1024
    assert server.gpu_spec().fp16_tflops == server.fp16_tflops


def test_catalog_model_by_name() -> None:
    server = ServerProfile(model="MiniMax-M2.7-FP8", fp16_tflops=8000, mem_bw_tb_s=6.4,
                           kv_cache_bytes=115e9)
    assert server.model_spec() == get_model("MiniMax-M2.7-FP8")
    assert server.block_bytes() == 16 * 126_976


def test_bad_field_names_file_and_field(tmp_path: Path) -> None:
    raw = _raw()
    raw["tiers"]["dram"]["stores"][0]["read_bw_bytes_s"] = -1
    path = _write(tmp_path, raw)
    with pytest.raises(ValueError, match=r"profile\.yaml.*tiers\.dram\.stores\.0\.read_bw"):
        load_profile(path)


def test_unknown_field_and_model_are_named(tmp_path: Path) -> None:
    raw = _raw()
    raw["engine"]["gpu_kv_gb"] = 1
    with pytest.raises(ValueError, match=r"engine\.gpu_kv_gb"):
        load_profile(_write(tmp_path, raw))
    raw = _raw()
    raw["model"] = "no-such-model"
    with pytest.raises(ValueError, match=r"no-such-model"):
        load_profile(_write(tmp_path, raw))


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_profile(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: [unclosed")
    with pytest.raises(ValueError, match="bad.yaml: malformed YAML"):
        load_profile(bad)


def test_gpu_must_hold_one_request() -> None:
    with pytest.raises(ValueError, match="less than one max_model_len"):
        ServerProfile(model="Qwen3-14B-BF16", fp16_tflops=1000, mem_bw_tb_s=2,
                      kv_cache_bytes=1e6, max_model_len=32_768)


def test_ttl_needs_ttl_s_and_chunk_sizes_agree() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        OffloadTier(name="dram", capacity_bytes=1e9, read_bw_bytes_s=1e9,
                    write_bw_bytes_s=1e9, eviction="ttl")
    a = OffloadTier(name="a", capacity_bytes=1e9, read_bw_bytes_s=1e9, write_bw_bytes_s=1e9)
    b = a.model_copy(update={"name": "b", "chunk_tokens": 128})
    with pytest.raises(ValueError, match="chunk_tokens"):
        SimTier(stores=[a, b])


def test_tier_name_must_match_key(profile: SimProfile) -> None:
    raw = profile.model_dump()
    raw["tiers"]["dram"]["name"] = "other"
    with pytest.raises(ValueError, match="differs from its key"):
        SimProfile.model_validate(raw)
    with pytest.raises(ValueError, match="unknown tier 'nvme'"):
        profile.tier("nvme")


def test_capacity_in_whole_chunks() -> None:
    store = OffloadTier(name="d", capacity_bytes=3.5 * 256 * 2048, read_bw_bytes_s=1,
                        write_bw_bytes_s=1)
    assert capacity_chunks(store, 2048) == 3


def test_store_names_unique_in_the_spec_and_the_twin_alike() -> None:
    """One check (`TierModel`) for both: the simulator's tier refuses what the spec does."""
    a = OffloadTier(name="a", capacity_bytes=1e9, read_bw_bytes_s=1e9, write_bw_bytes_s=1e9)
    with pytest.raises(ValueError, match="store names must be unique"):
        SimTier(stores=[a, a])


def test_run_folders_record_the_spec_names(profile: SimProfile) -> None:
    """meta.json records each setting under the spec's one name (plus what the twin derives
    from them); the derived flags are recorded as they were."""
    tier = profile.tier("flash")
    record = tier.meta_record()
    assert list(record) == ["name", "stores", "lmcache", "kv_cache_bytes", "twin_lookup_s",
                            "twin_connector_step_s", "twin_connector_request_s",
                            "twin_connector_token_s", "twin_write_back", "lmcache_mode",
                            "load_async", "lookup_async", "skip_l1"]
    assert record["stores"] == [s.model_dump(mode="json") for s in tier.stores]
    assert tier_record(record) == record  # already in the spec's names
    server = profile.meta_record()["server"]
    assert server["kv_cache_bytes"] == profile.server.kv_cache_bytes
    assert server["max_num_batched_tokens"] == profile.server.max_num_batched_tokens
    assert "gpu_kv_bytes" not in server and "max_batched_tokens" not in server


def test_old_run_folders_read_under_the_spec_names(profile: SimProfile) -> None:
    """A meta.json written before the rename (the twin's former names) reads the same."""
    tier = profile.tier("flash")
    old = {"name": "flash", "offload": [s.model_dump(mode="json") for s in tier.stores],
           "write_through": True, "load_async": False, "save_decode_kv": False,
           "skip_l1": False, "gpu_kv_bytes": None, "lookup_s": 0.001, "lookup_async": False,
           "connector_step_s": 0.002, "connector_request_s": 0.003}
    read = tier_record(old)
    assert read["stores"] == old["offload"] and read["twin_write_back"] is False
    assert read["lmcache"] == {"save_decode_cache": False}
    assert (read["kv_cache_bytes"], read["twin_lookup_s"], read["twin_connector_step_s"],
            read["twin_connector_request_s"]) == (None, 0.001, 0.002, 0.003)
    server = server_record({"model": "m", "gpu_kv_bytes": 1.0, "max_batched_tokens": 8})
    assert server == {"model": "m", "kv_cache_bytes": 1.0, "max_num_batched_tokens": 8}
