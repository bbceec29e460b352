import pandas as pd
import pytest

from kvrepro.studies import reference


def test_reference_table_has_every_figure() -> None:
    ref = reference.load_reference()
    assert {"A1", "A2", "A5", "A7", "B6", "B8"} <= set(ref.figure)
    assert ref.at["A7.dwpd_raid10", "value"] == 3.2


def test_compare_relative_difference() -> None:
    table = reference.compare({"A8.headroom": 27.8, "A7.dwpd_raid0": 1.6}, source="t")
    rows = table.set_index("id")
    assert rows.at["A8.headroom", "rel_diff_pct"] == pytest.approx((27.8 - 28) / 28 * 100)
    assert rows.at["A7.dwpd_raid0", "rel_diff_pct"] == 0


def test_compare_rejects_unknown_id() -> None:
    with pytest.raises(KeyError, match="A7.dwpd_raid11"):
        reference.compare({"A7.dwpd_raid11": 1.0})


def test_save_and_collect(tmp_path) -> None:
    reference.save_headline(reference.compare({"B8.cbound_tlc": 14.4}), tmp_path, "b")
    reference.save_headline(reference.compare({"A6.tokens_1h": 15.12}), tmp_path, "a")
    assert reference.save_headline(pd.DataFrame(), None, "x") is None
    table = reference.collect_headlines(tmp_path)
    assert list(table.id) == ["A6.tokens_1h", "B8.cbound_tlc"]
    text = reference.format_headlines(table)
    assert "15.12" in text and "+0.0 %" in text


def test_a_bound_is_shown_as_a_bound_not_as_a_miss() -> None:
    """A2.early_spread is "at most 1 %": a spread of 0 meets it (it read as -100 %, in red),
    2 % lies 100 % beyond it; A4.baseline_ttft_high is "at least 10 s"."""
    rows = reference.compare({"A2.early_spread": 0.0, "A4.baseline_ttft_high": 12.0,
                              "A4.dram_ttft_before_fill": 2.0}).set_index("id")
    assert rows.at["A2.early_spread", "bound"] == "at most"
    assert rows.at["A2.early_spread", "rel_diff_pct"] == 0
    assert rows.at["A4.baseline_ttft_high", "rel_diff_pct"] == 0
    assert rows.at["A4.dram_ttft_before_fill", "rel_diff_pct"] == pytest.approx(100.0)
    text = reference.format_headlines(rows.reset_index())
    assert "<= 1" in text and "meets bound" in text and "+100.0 % beyond" in text
    assert "-100.0 %" not in text
