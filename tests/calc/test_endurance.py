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


def test_c_bound_formula_on_independent_inputs() -> None:
    # A drive of 7,000 P/E cycles at WAF 3.5 rated over 5 years (1,825 days): DWPD =
    # 7000 / 3.5 / 1825 = 2000 / 1825. Writing 20 TB/day within that rating needs
    # 20 x 1825 / 2000 = 18.25 TB, or 18.25 / 4 TB on each of 4 drives. (The NAND presets
    # are not used: their WAF was back-solved from study B's C_bound values, so checking
    # them against those values would only echo the study.)
    tbw = endurance.tbw_bytes(7000, 3.84e12, 3.5)
    dwpd = endurance.rated_dwpd(tbw, 3.84e12, 1825)
    assert dwpd == pytest.approx(2000 / 1825)
    assert endurance.c_bound_bytes(20e12, dwpd) == pytest.approx(18.25e12)
    assert endurance.c_bound_bytes(20e12, dwpd, 4) == pytest.approx(18.25e12 / 4)


def test_nand_preset_dwpd_is_the_tbw_formula() -> None:
    presets = endurance.nand_presets().set_index("name")
    for _, row in presets.iterrows():
        tbw = endurance.tbw_bytes(row.pe_cycles, 7.68e12, row.waf)
        assert endurance.rated_dwpd(tbw, 7.68e12, row.rating_days) == pytest.approx(row.dwpd)


def test_b8_c_bound_is_labelled_an_echo() -> None:
    from kvrepro.studies import reference

    table = reference.compare({"B8.cbound_tlc": 14.4, "B8.cbound_slc": 0.29})
    assert set(table.kind) == {"echo"}
    assert table.why.str.contains("back-solved").all()


def test_c_bound_curves_scale_with_ssd_count() -> None:
    one = endurance.c_bound_curves([57.5], ["TLC"], n_ssds=1).c_bound_tb.item()
    four = endurance.c_bound_curves([57.5], ["TLC"], n_ssds=4).c_bound_tb.item()
    assert four == pytest.approx(one / 4)
    with pytest.raises(ValueError, match="parameter 'presets'"):
        endurance.c_bound_curves([1.0], ["MLC"])


def test_years_to_rated_endurance() -> None:
    assert endurance.years_to_rated_endurance(3.21, 3.0, 5) == pytest.approx(4.67, abs=0.01)
