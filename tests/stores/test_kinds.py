"""The store kinds: one module each, registered by kind, ordered by speed, and the only place
in the package that tells one kind from another (a grep checks it, and is checked itself)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from kvrepro.stores import KINDS, DramStore, FlashStore, SharedFsStore, StoreSpec
from kvrepro.tier_spec import TierSpec, override_server, shipped_server

ROOT = Path(__file__).resolve().parents[2]
RATES = {"read_bw_bytes_s": 1e9, "write_bw_bytes_s": 1e9}


def _store(kind: str, name: str | None = None, **fields) -> dict:
    return {"kind": kind, "name": name or kind, "capacity_bytes": 1e9, **RATES, **fields}


def _tier(*stores: dict, **fields) -> TierSpec:
    return TierSpec.model_validate({"name": "t", "stores": list(stores), **fields})


def test_every_kind_is_registered_once_with_its_own_level() -> None:
    assert set(KINDS) == {"dram", "flash", "shared_fs"}
    levels = [cls.level for cls in KINDS.values()]
    assert len(set(levels)) == len(levels)
    parsed = TypeAdapter(StoreSpec).validate_python(_store("shared_fs", path="/mnt/kv"))
    assert isinstance(parsed, SharedFsStore)
    with pytest.raises(ValidationError, match="nvme"):
        TypeAdapter(StoreSpec).validate_python(_store("nvme"))


def test_a_kind_takes_only_its_own_fields() -> None:
    with pytest.raises(ValidationError, match="path"):
        _tier(_store("dram", path="/tmp/x"))
    with pytest.raises(ValidationError, match="drives"):
        _tier(_store("dram"), _store("shared_fs", drives=4))


@pytest.mark.parametrize("kinds", [["flash", "dram"], ["dram", "dram"],
                                   ["dram", "shared_fs", "flash"], ["flash", "shared_fs"]])
def test_misplaced_stores_are_refused(kinds: list[str]) -> None:
    stores = [_store(k, f"{k}{i}") for i, k in enumerate(kinds)]
    with pytest.raises(ValidationError, match="fastest first|L1"):
        _tier(*stores)


def test_stores_are_ordered_by_level_not_by_their_spelling(monkeypatch) -> None:
    """The old rule was `kinds == sorted(kinds)`: alphabetical. A shared filesystem made
    faster than the local flash (a level between dram's and flash's) must go before it."""
    _tier(_store("dram"), _store("flash"), _store("shared_fs"))
    monkeypatch.setattr(SharedFsStore, "level", 0.5)
    _tier(_store("dram"), _store("shared_fs"), _store("flash"))
    with pytest.raises(ValidationError, match="fastest first"):
        _tier(_store("dram"), _store("flash"), _store("shared_fs"))


def test_a_tier_is_named_after_its_slowest_store() -> None:
    assert _tier().kind == "baseline"
    assert _tier(_store("dram")).kind == "dram"
    assert _tier(_store("dram", "staging"), _store("flash")).kind == "flash"
    assert _tier(_store("dram"), _store("shared_fs")).kind == "shared_fs"
    assert _tier(_store("dram"), connector="native").kind == "native_offload"


def test_shared_fs_renders_for_lmcache_vllm_the_twin_and_the_bill() -> None:
    store = SharedFsStore.model_validate(_store(
        "shared_fs", path="/mnt/kv", object_latency_s=0.004, reads_in_flight=4,
        servers_sharing=8, capacity_bytes=8e12))
    assert store.lmcache_l2_adapter() == {"type": "fs", "base_path": "/mnt/kv"}
    assert store.lmcache_in_process() == {"remote_url": "fs:///mnt/kv"}
    assert store.native_offload() == {"secondary_tier": {"type": "fs", "root_dir": "/mnt/kv"}}
    twin = store.twin_store()
    assert twin["chunk_read_latency_s"] == pytest.approx(0.001)
    assert twin["chunk_write_latency_s"] == pytest.approx(0.004)
    assert twin["eviction"] == "none" and twin["hard_limit"] is True
    assert store.bill().shared_fs_bytes == pytest.approx(1e12)
    assert store.folder().shared and store.folder().path == "/mnt/kv"
    tier = _tier(_store("dram"), store.model_dump(), connector="native")
    assert tier.native_offload() == {"cpu_bytes_to_use": 1_000_000_000, "secondary_tiers": [
        {"type": "fs", "root_dir": "/mnt/kv"}]}


def test_shared_fs_refuses_what_lmcache_cannot_do() -> None:
    """LMCache's fs adapter never evicts: an LRU shared store is a simulator what-if only."""
    store = SharedFsStore.model_validate(_store("shared_fs", eviction="lru"))
    with pytest.raises(ValueError, match="never evicts"):
        store.check_eviction_rendered()
    with pytest.raises(ValidationError, match="object_latency_s"):
        SharedFsStore.model_validate(_store("shared_fs", chunk_read_latency_s=0.01))


def test_the_other_kinds_render_as_before() -> None:
    dram = DramStore.model_validate(_store("dram", capacity_bytes=2**31))
    assert dram.lmcache_in_process() == {"local_cpu": True, "max_local_cpu_size_gib": 2.0}
    assert dram.deployed_capacity_bytes({"l1_size_gib": 2.0}, 0) == 2**31
    flash = FlashStore.model_validate(_store("flash", capacity_bytes=2**32, drives=4,
                                             drive_tb=0.01))
    adapter = flash.lmcache_l2_adapter()
    assert adapter["type"] == "fs_native" and adapter["max_capacity_gb"] == 4.0
    assert flash.deployed_capacity_bytes({"l2_adapters": [adapter]}, 1) == 2**32
    assert flash.bill().drives == 4 and dram.bill().dram_bytes == 2**31


def test_overrides_pick_stores_by_name_or_by_kind() -> None:
    spec = shipped_server("study_a")
    by_kind = override_server(spec, {"kind:dram.capacity_bytes": 1e9})
    assert [s.capacity_bytes for s in by_kind.tier("flash").stores][0] == 1e9  # staging too
    assert by_kind.tier("dram").stores[0].capacity_bytes == 1e9
    by_name = override_server(spec, {"store:staging.capacity_bytes": 2e9})
    assert by_name.tier("flash").stores[0].capacity_bytes == 2e9
    unchanged = spec.tier("dram").stores[0].capacity_bytes
    assert by_name.tier("dram").stores[0].capacity_bytes == unchanged
    alias = override_server(spec, {"dram_gb": 3})  # by name, decimal GB
    assert alias.tier("dram").stores[0].capacity_bytes == 3e9
    staging = spec.tier("flash").stores[0].capacity_bytes
    assert alias.tier("flash").stores[0].capacity_bytes == staging
    for bad in ("kind:nvme.capacity_bytes", "store:staging", "kind:dram.nope"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            override_server(spec, {bad: 1})


KIND_WORDS = "|".join(sorted(KINDS))
KIND_COMPARISON = re.compile(
    rf"""(?:[=!]=\s*["']({KIND_WORDS})["'])|(?:["']({KIND_WORDS})["']\s*[=!]=)"""
    rf"""|(?:\bif\b.*\bin\s*[(\[{{][^)\]}}]*["']({KIND_WORDS})["'])|(?:\.store\(\s*["'])""")


def kind_comparisons(root: Path) -> list[str]:
    """Lines of the package outside `kvrepro/stores/` that compare with a kind's name."""
    hits = []
    for path in sorted((root / "kvrepro").rglob("*.py")):
        if "stores" in path.relative_to(root / "kvrepro").parts[:1]:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if KIND_COMPARISON.search(line.split("#")[0]):
                hits.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return hits


def test_no_kind_is_told_apart_outside_the_stores_package() -> None:
    assert kind_comparisons(ROOT) == []


@pytest.mark.parametrize("line", ['if store.kind == "flash":', "x = 'dram' != kind",
                                  'if k in ("dram", "flash"):', 'flash = tier.store("flash")'])
def test_the_grep_sees_a_comparison(tmp_path: Path, line: str) -> None:
    (tmp_path / "kvrepro").mkdir()
    (tmp_path / "kvrepro" / "x.py").write_text(f"{line}\nfor role in ('dram', 'flash'):\n")
    assert kind_comparisons(tmp_path) == [f"kvrepro/x.py:1: {line}"]


def test_an_error_names_the_key_as_written_not_the_kind_tag() -> None:
    """The union adds the kind to pydantic's error path (`stores.0.dram.read_bw_bytes_s`);
    the message names the key the user wrote."""
    spec = shipped_server("study_a")
    with pytest.raises(ValueError, match=r"key tiers\.dram\.stores\.0\.read_bw_bytes_s: "):
        override_server(spec, {"tiers.dram.stores.0.read_bw_bytes_s": -1})
    with pytest.raises(ValueError, match=r"key tiers\.flash\.stores\.1: Input tag 'nvme'"):
        override_server(spec, {"tiers.flash.stores.1.kind": "nvme"})
