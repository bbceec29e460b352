import pandas as pd
import pytest

from kvrepro.studies import provenance, reference
from kvrepro.studies.study_a import check_targets, targets_met


def test_registry_names_only_reference_ids_and_known_kinds() -> None:
    ids = set(reference.load_reference().index)
    unknown = sorted(set(provenance.HEADLINE_KINDS) - ids)
    assert not unknown, f"provenance lists ids the reference table lacks: {unknown}"
    kinds = {kind for kind, _ in provenance.HEADLINE_KINDS.values()}
    assert kinds <= set(provenance.KINDS) - {"predicted"}
    assert all(why for _, why in provenance.HEADLINE_KINDS.values())


@pytest.mark.parametrize("ref_id, kind", [
    ("A6.capacity_1h", "echo"), ("A7.dwpd_raid10", "echo"), ("A8.headroom", "echo"),
    ("B8.cbound_qlc_zns", "echo"), ("A2.early_spread", "echo"), ("B6.opt_high", "fitted"),
    ("A2.dram_peak_gain", "fitted"), ("A2.dram_retained", "predicted"),
    ("B2.ws_peak", "predicted"), ("B7.qps_0.3", "predicted"),
])
def test_compare_gives_each_number_its_kind(ref_id: str, kind: str) -> None:
    row = reference.compare({ref_id: 1.0}).iloc[0]
    assert row.kind == kind
    assert (row.why != "") == (kind != "predicted")


def test_a_measuring_notebook_overrides_the_kind() -> None:
    table = reference.compare({"B6.opt_high": 1.3, "B9.ssd_chunk_ms_low": 30.0},
                              kind="measured")
    assert list(table.kind) == ["measured", "measured"]
    per_id = reference.compare({"B6.opt_high": 1.3, "B7.qps_0.1": 3.0},
                               kind={"B6.opt_high": "measured"}).set_index("id")
    assert per_id.kind.to_dict() == {"B6.opt_high": "measured", "B7.qps_0.1": "predicted"}
    with pytest.raises(ValueError, match="unknown kind 'guessed'.*parameter 'kind'"):
        reference.compare({"B6.opt_high": 1.3}, kind="guessed")


def test_count_by_kind_counts_rows_and_closeness() -> None:
    table = pd.DataFrame({"kind": ["predicted", "predicted", "echo", "fitted"],
                          "rel_diff_pct": [5.0, -20.0, 0.0, 40.0]})
    counts = provenance.count_by_kind(table).set_index("kind")
    assert counts.loc["predicted"].tolist() == [2, 1, 2]
    assert counts.loc["echo"].tolist() == [1, 1, 1]
    assert counts.loc["fitted"].tolist() == [1, 0, 0]
    assert counts.loc["measured"].tolist() == [0, 0, 0]


def test_study_a_summary_counts_predicted_targets_only() -> None:
    # Every value set exactly to the study's: all targets are met, but the fitted and
    # construction ones must not be counted as reproduced.
    ref = reference.load_reference()
    ids = [i for i in ref.index if i.startswith(("A2.", "A3.", "A4.", "A5."))]
    values = {i: float(ref.at[i, "value"]) for i in ids}
    values["A4.baseline_ttft_high"] = 11.0
    checked = check_targets(reference.compare(values))
    counts = targets_met(checked)
    judged = checked[checked.met.notna()]
    assert counts["predicted"] + counts["not_predicted"] == len(judged)
    not_predicted = set(judged[judged.kind != "predicted"].id)
    assert {"A2.early_spread", "A2.dram_fill_time", "A2.dram_peak_gain"} <= not_predicted
    assert "A2.dram_retained" not in not_predicted


def test_headline_text_shows_the_kind() -> None:
    text = reference.format_headlines(reference.compare({"A7.dwpd_raid0": 1.6}))
    assert "echo" in text.splitlines()[1]
