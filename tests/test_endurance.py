import pytest

from kvrepro.calc import endurance


def test_study_a_dwpd() -> None:
    raid10 = endurance.dwpd_from_write_rate(1.9e9, 8, 12.8e12, "RAID10")
    raid0 = endurance.dwpd_from_write_rate(1.9e9, 8, 12.8e12, "RAID0")
    assert round(raid10, 2) == 3.21
    assert round(raid0, 2) == 1.60
    assert raid10 == pytest.approx(2 * raid0)


@pytest.mark.parametrize("level, drives, factor", [
    ("RAID0", 8, 1.0), ("raid1", 2, 2.0), (10, 8, 2.0), ("RAID5", 8, 8 / 7), ("RAID6", 8, 8 / 6),
])
def test_raid_write_factor(level, drives, factor) -> None:
    assert endurance.raid_write_factor(level, drives) == pytest.approx(factor)


def test_unknown_raid_level_names_parameter() -> None:
    with pytest.raises(ValueError, match=r"unknown RAID level 'RAID7' \(parameter 'raid_level'\)"):
        endurance.dwpd_from_write_rate(1.9e9, 8, 12.8e12, "RAID7")


def test_raid10_needs_even_drive_count() -> None:
    with pytest.raises(ValueError, match="n_drives"):
        endurance.raid_write_factor("RAID10", 5)


def test_negative_write_rate_names_parameter() -> None:
    with pytest.raises(ValueError, match="parameter .write_rate_bytes_s."):
        endurance.dwpd_from_write_rate(-1.9e9, 8, 12.8e12, "RAID10")


def test_tbw_and_rated_dwpd_hand_case() -> None:
    # 3,000 P/E on 1 TB with WAF 2 = 1,500 TB written; over 5 years (1,825 d) = 0.822 DWPD.
    tbw = endurance.tbw_bytes(3000, 1e12, 2.0)
    assert tbw == pytest.approx(1.5e15)
    assert endurance.rated_dwpd(tbw, 1e12, 1825) == pytest.approx(0.8219, abs=1e-4)


@pytest.mark.parametrize("preset, c_bound_tb", [
    ("SLC", 0.29), ("TLC", 14.4), ("QLC", 28.8), ("TLC+OP", 4.8), ("QLC+ZNS", 8.8),
])
def test_study_b_c_bound(preset: str, c_bound_tb: float) -> None:
    presets = endurance.nand_presets().set_index("name")
    row = presets.loc[preset]
    # The preset's DWPD is the TBW formula itself, for any capacity.
    tbw = endurance.tbw_bytes(row.pe_cycles, 7.68e12, row.waf)
    assert endurance.rated_dwpd(tbw, 7.68e12, row.rating_days) == pytest.approx(row.dwpd)
    computed = endurance.c_bound_bytes(57.5e12, row.dwpd) / 1e12
    assert computed == pytest.approx(c_bound_tb, abs=0.5 * 10 ** -(1 if c_bound_tb > 1 else 2))


def test_c_bound_curves_scale_with_ssd_count() -> None:
    one = endurance.c_bound_curves([57.5], ["TLC"], n_ssds=1).c_bound_tb.item()
    four = endurance.c_bound_curves([57.5], ["TLC"], n_ssds=4).c_bound_tb.item()
    assert four == pytest.approx(one / 4)
    with pytest.raises(ValueError, match="parameter 'presets'"):
        endurance.c_bound_curves([1.0], ["MLC"])


def test_years_to_rated_endurance() -> None:
    assert endurance.years_to_rated_endurance(3.21, 3.0, 5) == pytest.approx(4.67, abs=0.01)
