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
