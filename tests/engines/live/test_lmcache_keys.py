"""The LMCache config keys pinned from LMCache 0.5.6, and the check of a config against them."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvrepro.engines.live.lmcache_keys import (
    LMCACHE_COMMIT,
    LMCACHE_KEYS,
    LMCACHE_SOURCE_OBJECT,
    LMCACHE_SOURCE_PATH,
    LMCACHE_VERSION,
    installed_lmcache_keys,
    validate_lmcache_config,
)

DRAM = {"chunk_size": 256, "local_cpu": True, "max_local_cpu_size": 5.0}
FLASH = {"chunk_size": 256, "local_cpu": True, "max_local_cpu_size": 1.0,
         "local_disk": "file:///tmp/x/", "max_local_disk_size": 10.0}


def test_pinned_source_is_named() -> None:
    assert LMCACHE_VERSION == "0.5.6" and LMCACHE_COMMIT == "3e11e108"
    assert LMCACHE_SOURCE_PATH == "lmcache/v1/config.py"
    assert LMCACHE_SOURCE_OBJECT == "_CONFIG_DEFINITIONS"
    assert len(LMCACHE_KEYS) == 108


def test_tier_keys_have_lmcache_types() -> None:
    assert LMCACHE_KEYS["chunk_size"] == ("int", "256")
    assert LMCACHE_KEYS["local_cpu"] == ("bool", "True")
    assert LMCACHE_KEYS["max_local_cpu_size"] == ("float", "5.0")
    assert LMCACHE_KEYS["local_disk"] == ("Optional[str]", "None")
    assert LMCACHE_KEYS["max_local_disk_size"] == ("float", "0.0")


@pytest.mark.parametrize("cfg", [DRAM, FLASH], ids=["dram", "flash"])
def test_tier_configs_validate(cfg: dict) -> None:
    validate_lmcache_config(cfg)


def test_int_sizes_and_none_defaults_are_accepted() -> None:
    validate_lmcache_config({"max_local_cpu_size": 5, "local_disk": None,
                             "blend_check_layers": None, "lmcache_worker_ports": [1, 2]})


def test_misspelled_key_is_named_with_a_suggestion() -> None:
    with pytest.raises(ValueError, match="'max_local_cpu_sise'.*'max_local_cpu_size'"):
        validate_lmcache_config({**DRAM, "max_local_cpu_sise": 5.0})


def test_every_unknown_key_is_named() -> None:
    with pytest.raises(ValueError) as err:
        validate_lmcache_config({**FLASH, "local_dsk": "file:///x/", "tier": "flash"})
    assert "'local_dsk'" in str(err.value) and "'tier'" in str(err.value)


def test_old_names_point_to_the_new_ones() -> None:
    with pytest.raises(ValueError, match="'enable_xpyd' \\(an old name; now 'enable_pd'\\)"):
        validate_lmcache_config({"enable_xpyd": True})
    with pytest.raises(ValueError, match="'nixl_peer_port' \\(an old name; no longer defined"):
        validate_lmcache_config({"nixl_peer_port": 5000})


@pytest.mark.parametrize(("key", "value"), [
    ("chunk_size", 256.0), ("chunk_size", True), ("local_cpu", "true"),
    ("max_local_cpu_size", "5GB"), ("local_disk", 3), ("chunk_size", None),
    ("lmcache_worker_ports", [1, "2"]), ("extra_config", ["a"]),
])
def test_wrong_types_are_named(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"'{key}' must be"):
        validate_lmcache_config({key: value})


def test_known_keys_can_come_from_elsewhere() -> None:
    validate_lmcache_config({"brand_new_key": 1}, known_keys={"brand_new_key"})
    with pytest.raises(ValueError, match="given key list.*'chunk_size'"):
        validate_lmcache_config(DRAM, known_keys={"local_cpu", "max_local_cpu_size"})


@pytest.mark.skipif(importlib.util.find_spec("lmcache") is not None,
                    reason="lmcache is installed here")
def test_installed_keys_are_none_without_lmcache() -> None:
    assert installed_lmcache_keys() is None


@pytest.fixture
def fake_lmcache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An importable stand-in `lmcache` package; its config.py is written by each test."""
    package = tmp_path / "lmcache" / "v1"
    package.mkdir(parents=True)
    (tmp_path / "lmcache" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    real = {n: m for n, m in sys.modules.items() if n == "lmcache" or n.startswith("lmcache.")}
    for name in real:  # the installed lmcache (make live-cpu), if imported, steps aside
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package / "config.py"
    for name in [n for n in sys.modules if n == "lmcache" or n.startswith("lmcache.")]:
        del sys.modules[name]
    sys.modules.update(real)


def test_installed_keys_read_config_definitions(fake_lmcache: Path) -> None:
    fake_lmcache.write_text(textwrap.dedent("""
        _CONFIG_DEFINITIONS = {"chunk_size": {"type": int, "default": 256},
                               "local_cpu": {"type": bool, "default": True}}
    """))
    keys = installed_lmcache_keys()
    assert keys == {"chunk_size", "local_cpu"}
    with pytest.raises(ValueError, match="'max_local_cpu_size'"):
        validate_lmcache_config(DRAM, known_keys=keys)


def test_installed_keys_read_an_old_dataclass(fake_lmcache: Path) -> None:
    fake_lmcache.write_text(textwrap.dedent("""
        from dataclasses import dataclass

        @dataclass
        class LMCacheEngineConfig:
            chunk_size: int
            local_device: str
    """))
    assert installed_lmcache_keys() == {"chunk_size", "local_device"}
