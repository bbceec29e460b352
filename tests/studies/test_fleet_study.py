import math

import pandas as pd
import pytest

from kvrepro.fleet_spec import shipped_fleet
from kvrepro.studies.fleet_study import (
    capacity_for_hit_share,
    flash_array,
    fleet_dwpd_table,
    fleet_points,
)
from kvrepro.studies.whatif import check_default_point


def test_fleet_points_cover_routing_pool_and_size_and_run_on_the_default_point() -> None:
    fleet = shipped_fleet("study_a_8x")
    points = fleet_points(fleet, routings=["round_robin", "session_affinity"],
                          flash_gb_per_server=[None, 100.0], duration_s=600.0)
    assert len(points) == 2 * 2 * 2
    assert {(p["routing"], p["kv_pool"]) for p in points} == {
        (r, k) for r in ("round_robin", "session_affinity") for k in ("private", "shared")}
    assert all(p["session_rate_per_min"] == 2.5 * 8 for p in points)
    assert all(p["shared_pool.capacity_scale"] == 8.0 for p in points)
    assert sum("flash_gb" in p for p in points) == 4
    for i, point in enumerate(points):
        check_default_point(point, f"point {i}")


def test_capacity_for_hit_share_interpolates_between_sizes() -> None:
    table = pd.DataFrame({
        "kv_pool": ["shared"] * 3 + ["private"] * 3,
        "routing": ["round_robin"] * 6,
        "flash_capacity_bytes": [1e12, 2e12, 4e12, 1e12, 2e12, 4e12],
        "cached_share": [0.2, 0.6, 0.8, 0.1, 0.3, 0.5]})
    out = capacity_for_hit_share(table, 0.4).set_index("kv_pool")
    # shared: 0.4 lies halfway between 0.2 (1 TB) and 0.6 (2 TB) -> 1.5 TB
    assert out.at["shared", "capacity_bytes"] == pytest.approx(1.5e12)
    # private: 0.4 lies halfway between 0.3 (2 TB) and 0.5 (4 TB) -> 3 TB
    assert out.at["private", "capacity_bytes"] == pytest.approx(3e12)
    never = capacity_for_hit_share(table, 0.9).set_index("kv_pool")
    assert math.isnan(never.at["private", "capacity_bytes"])
    assert not never.at["private", "reached"]
    first = capacity_for_hit_share(table, 0.05).set_index("kv_pool")
    assert first.at["shared", "capacity_bytes"] == 1e12
    with pytest.raises(ValueError, match="target_share"):
        capacity_for_hit_share(table, 1.5)


def test_fleet_dwpd_by_hand() -> None:
    # 8 servers x 8 drives of 12.8 TB; 81.92 TB written a day over 64 drives = 1.28 TB a
    # drive a day = 0.1 DWPD with RAID0, twice that with RAID10 (every byte written twice).
    table = pd.DataFrame({"n_servers": [8], "routing": ["session_affinity"],
                          "kv_pool": ["shared"], "flash_bytes_written_per_day": [81.92e12]})
    out = fleet_dwpd_table(table, 8, 12.8e12, ["RAID0", "RAID10"]).set_index("raid_level")
    assert out.at["RAID0", "dwpd"] == pytest.approx(0.1)
    assert out.at["RAID10", "dwpd"] == pytest.approx(0.2)
    assert set(out.n_drives) == {64}


def test_flash_array_reads_the_tier_spec() -> None:
    assert flash_array(shipped_fleet("study_a_8x")) == (8, 12.8e12)
    with pytest.raises(ValueError, match="no flash array"):
        flash_array(shipped_fleet("cpu_tiny_2x"))


def test_compare_fleet_summaries_matches_instances_and_signs_errors() -> None:
    from kvrepro.studies.fleet_study import compare_fleet_summaries

    keys = {"kv_pool": ["shared", "shared"], "tier": ["dram", "dram"],
            "routing": ["round_robin", "round_robin"], "instance": ["0", "total"]}
    live = pd.DataFrame({**keys, "throughput_tok_s": [100.0, 200.0],
                         "ttft_median_s": [0.1, 0.1], "cached_share": [0.5, 0.0]})
    sim = pd.DataFrame({**keys, "throughput_tok_s": [110.0, 180.0],
                        "ttft_median_s": [0.1, 0.05], "cached_share": [0.25, 0.3]})
    out = compare_fleet_summaries(live, sim, ["throughput_tok_s", "ttft_median_s",
                                              "cached_share"])
    table = out.set_index(["tier", "metric"])
    assert table.at[("instance 0", "throughput_tok_s"), "error"] == pytest.approx(10.0)
    assert table.at[("total", "throughput_tok_s"), "error"] == pytest.approx(-10.0)
    assert table.at[("total", "ttft_median_s"), "error"] == pytest.approx(-50.0)
    # shares in percentage points: 0.25 vs 0.5 is -25 pp, and 0.3 vs 0 is +30 pp (no ratio)
    assert table.at[("instance 0", "cached_share"), "error"] == pytest.approx(-25.0)
    assert table.at[("total", "cached_share"), "error"] == pytest.approx(30.0)
    assert set(table["error_unit"]) == {"%", "pp"}
    assert table.at[("total", "cached_share"), "error_unit"] == "pp"
    assert set(out.run) == {"shared dram, round robin"}


def test_fleet_host_cpu_sets_the_twin_beside_the_accounting() -> None:
    """Every role of the live fleet run once, live and twin; the twin's worker spends its
    forward passes and more (its share of the steps' host part)."""
    from kvrepro._paths import data_file
    from kvrepro.studies.fleet_study import fleet_host_cpu

    table = fleet_host_cpu(data_file("live", "cpu_tiny_fleet_slices",
                                     "shared-dram-round_robin"))
    assert {"api_server", "engine_core", "worker", "client", "lmcache_server",
            "router"} <= set(table.index) and table.index.is_unique
    assert (table.live_cpu_busy.dropna() > 0).all()
    assert 0 < table.twin_cpu_busy["worker_forward"] < table.twin_cpu_busy["worker"]
