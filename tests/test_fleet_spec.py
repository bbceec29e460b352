"""Fleet specs (`kvrepro.fleet_spec`): every shipped file loads, and mistakes are named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvrepro._paths import data_dir
from kvrepro.fleet_spec import (
    LIVE_ROUTER_POLICY,
    ROUTINGS,
    FleetSpec,
    load_fleet,
    shipped_fleet,
)

FLEET_FILES = sorted((data_dir() / "fleets").glob("*.yaml"))


def test_fleets_are_shipped() -> None:
    assert {p.stem for p in FLEET_FILES} >= {"cpu_tiny_2x", "study_a_8x"}


@pytest.mark.parametrize("path", FLEET_FILES, ids=lambda p: p.stem)
def test_every_shipped_fleet_loads_with_a_tier_of_its_server(path: Path) -> None:
    fleet = load_fleet(path)
    raw = yaml.safe_load(path.read_text())
    assert fleet.n_servers == raw["n_servers"] and fleet.tier == raw["tier"]
    assert fleet.tier in fleet.server_spec().tiers
    assert fleet.routing in ROUTINGS
    assert shipped_fleet(path.stem) == fleet


def test_study_a_fleet_pools_eight_servers() -> None:
    fleet = shipped_fleet("study_a_8x")
    assert fleet.n_servers == 8 and fleet.kv_pool == "shared"
    assert fleet.shared_pool.capacity_scale == 8.0
    assert fleet.shared_pool.network_latency_s > 0


def test_every_routing_has_a_live_router_policy() -> None:
    assert set(LIVE_ROUTER_POLICY) == set(ROUTINGS)


def test_prefix_aware_defaults_are_vllm_routers() -> None:
    """vllm-router 0.1.17's `--help` defaults: --cache-threshold 0.3,
    --balance-abs-threshold 64, --balance-rel-threshold 1.5."""
    settings = FleetSpec(server="cpu_tiny", tier="dram").prefix_aware
    assert (settings.cache_threshold, settings.balance_abs_threshold,
            settings.balance_rel_threshold) == (0.3, 64, 1.5)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def test_a_misspelled_key_is_named_with_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "server: cpu_tiny\ntier: dram\nshared_pool: {latency_s: 1}\n")
    with pytest.raises(ValueError, match=r"fleet\.yaml.*shared_pool\.latency_s"):
        load_fleet(path)


def test_an_unknown_tier_fails_at_load(tmp_path: Path) -> None:
    path = _write(tmp_path, "server: cpu_tiny\ntier: dramm\n")
    with pytest.raises(ValueError, match=r"fleet\.yaml.*dramm"):
        load_fleet(path)


def test_a_bad_routing_and_a_missing_file_are_errors(tmp_path: Path) -> None:
    path = _write(tmp_path, "server: cpu_tiny\ntier: dram\nrouting: random\n")
    with pytest.raises(ValueError, match="routing"):
        load_fleet(path)
    with pytest.raises(FileNotFoundError):
        load_fleet(tmp_path / "absent.yaml")
