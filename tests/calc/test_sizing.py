import pytest

from kvrepro.calc import sizing
from kvrepro.model_spec import kv_bytes_per_token


def test_one_hour_at_4200_tok_s() -> None:
    held = sizing.kv_capacity(4200, 3600, kv_bytes_per_token("MiniMax-M2.7-FP8"))
    assert held["tokens"] == pytest.approx(15.12e6)
    assert held["kv_bytes"] / 1e12 == pytest.approx(1.92, abs=0.005)
    assert held["kv_bytes"] / 2**40 == pytest.approx(1.75, abs=0.005)   # 1.75 TiB


def test_capacity_grid_is_tidy_and_linear() -> None:
    grid = sizing.capacity_grid("MiniMax-M2.7-FP8", [1000, 4200])
    assert len(grid) == 4 and set(grid.ttl_s) == {300.0, 3600.0}
    one = grid[(grid.token_rate_tok_s == 1000) & (grid.ttl_s == 300)].kv_bytes.item()
    twelve = grid[(grid.token_rate_tok_s == 1000) & (grid.ttl_s == 3600)].kv_bytes.item()
    assert twelve == pytest.approx(12 * one)


def test_negative_rate_names_parameter() -> None:
    with pytest.raises(ValueError, match="parameter .token_rate_tok_s. must be"):
        sizing.kv_capacity(-1, 3600, 126_976)


def test_headroom() -> None:
    assert sizing.bandwidth_headroom(114e9, 4.1e9) == pytest.approx(27.8, abs=0.05)
    table = sizing.headroom_table(114e9, {"write": 4.1e9, "read": 1.1e9})
    assert table.set_index("what").headroom["read"] == pytest.approx(103.6, abs=0.1)
    with pytest.raises(ValueError, match="peak_kv_traffic_bytes_s"):
        sizing.bandwidth_headroom(114e9, 0)
