import matplotlib.pyplot as plt
import pandas as pd
import pytest

from kvrepro.plots import save_figure
from kvrepro.plots import sizing_figures as figs
from kvrepro.studies import sizing_report


@pytest.fixture(scope="module")
def tables():
    return sizing_report.sizing_tables(sizing_report.SizingParams())


@pytest.mark.parametrize("figure_id, draw, unit", [
    ("A6", lambda t: figs.a6_capacity_vs_ttl(t["A6"]), "(TB)"),
    ("A7", lambda t: figs.a7_dwpd_vs_write_rate(t["A7"], 3.0, 1.9e9), "(GB/s)"),
    ("A8", lambda t: figs.a8_bandwidth_headroom(t["A8"]), "(GB/s"),
    ("B3", lambda t: figs.b3_memory_hierarchy(t["B3"]), "latency (s"),
    ("B4", lambda t: figs.b4_prefill_ttft(t["B4"]), "TTFT (s)"),
    ("B8", lambda t: figs.b8_c_bound(t["B8"], 57.5), "C_bound (TB)"),
])
def test_figure_has_units_and_title(tables, figure_id, draw, unit) -> None:
    fig = draw(tables)
    assert isinstance(fig, plt.Figure)
    labels = " ".join(ax.get_xlabel() + " " + ax.get_ylabel() for ax in fig.axes)
    assert unit in labels
    titles = " ".join([ax.get_title() for ax in fig.axes] + [fig.get_suptitle()])
    assert figure_id in titles


def test_b8_annotates_study_b_values(tables) -> None:
    fig = figs.b8_c_bound(tables["B8"], 57.5)
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"0.29", "14.4", "28.8", "4.81", "8.81"} <= texts


def test_missing_column_is_named(tables) -> None:
    with pytest.raises(ValueError, match=r"figure A7: data lacks column\(s\) \['dwpd'\]"):
        figs.a7_dwpd_vs_write_rate(tables["A7"].drop(columns="dwpd"))


def test_save_figure_writes_png_and_svg(tables, tmp_path) -> None:
    paths = save_figure(figs.a8_bandwidth_headroom(tables["A8"]), tmp_path, "A8-test")
    assert [p.name for p in paths] == ["A8-test.png", "A8-test.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in paths[1].read_text()


def test_workload_figures() -> None:
    from kvrepro.plots import workload_figures as wfigs
    from kvrepro.workload import AgenticSpec, generate_agentic

    w = generate_agentic(AgenticSpec(duration_s=1800, p_returning=0.3))
    figs_ = [wfigs.workload_arrivals(w.sessions, 2.5, 180),
             wfigs.workload_context_growth(w.turns, [0, 1, 2], 65_536),
             wfigs.workload_turn_sizes(w.turns),
             wfigs.workload_resumes(w.turns, 1800, 180)]
    for fig in figs_:
        assert isinstance(fig, plt.Figure)
        labels = " ".join(ax.get_xlabel() for ax in fig.axes)
        assert "(min)" in labels or "(tokens" in labels
    resumes = figs_[3].axes[0]
    assert len(resumes.get_yticks()) == int(w.turns.is_resume.sum()) > 0


def test_error_grid_labels_stay_legible_on_dark_cells() -> None:
    """Figure sim-validation-errors: a label on a dark cell (a large error, deep red or
    blue) is light, one on a pale cell (a small error) is dark."""
    from matplotlib.colors import to_rgba

    from kvrepro.plots.validation_figures import label_colour, sim_validation_errors

    table = pd.DataFrame({"run": ["r"] * 3, "tier": ["t"] * 3,
                          "metric": ["ttft_median_s", "total_tok_s", "cached_share"],
                          "error": [80.0, 1.0, -45.0], "error_unit": ["%", "%", "pp"]})
    fig = sim_validation_errors(table, 10.0)
    colours = {t.get_text(): to_rgba(t.get_color()) for t in fig.axes[0].texts}
    assert colours == {"+80 %": to_rgba("white"), "+1.0 %": to_rgba("black"),
                       "-45 pp": to_rgba("white")}
    assert label_colour("#ffffff") == "black" and label_colour("#053061") == "white"
    plt.close(fig)


def test_the_value_figure_names_the_tolerance_the_error_grid_bolds() -> None:
    """By default the sim-validation subtitle and the error grid's title say the same ±."""
    from kvrepro.plots.validation_figures import sim_validation, sim_validation_errors

    table = pd.DataFrame({"run": ["r"], "tier": ["t"], "metric": ["ttft_median_s"],
                          "live": [0.1], "sim": [0.2], "error": [100.0], "error_unit": ["%"]})
    values, grid = sim_validation(table), sim_validation_errors(table)
    said = " ".join(t.get_text() for t in values.texts)
    bolded = grid.axes[0].get_title(loc="left").replace("\n", " ")
    tolerance = bolded.split("beyond ")[1].split(";")[0].strip()
    assert f"which miss {tolerance} %" in said, (said, tolerance)
    plt.close(values)
    plt.close(grid)
