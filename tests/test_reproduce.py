"""The papermill pipeline: the sizing notebook with small parameters, failures, the CLI."""

import shutil

import pandas as pd
import pytest

from kvrepro import cli
from kvrepro.reproduce import find_notebooks, parse_overrides, reproduce
from tests.conftest import NOTEBOOKS

SMALL = {"token_rates_tok_s": [4200], "prompt_tokens": [1024], "max_ttl_s": 600}


def test_parse_overrides() -> None:
    assert parse_overrides(["a=1", "b=[1, 2]", "c=RAID0", "d=1.9e9"]) == {
        "a": 1, "b": [1, 2], "c": "RAID0", "d": 1.9e9}
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides(["novalue"])


def test_notebooks_are_ordered() -> None:
    names = [p.name for p in find_notebooks(NOTEBOOKS)]
    assert names == sorted(names) and names[0].startswith("01_")


def test_sizing_notebook_numbers(tmp_path) -> None:
    result = reproduce(NOTEBOOKS, tmp_path / "fig", tmp_path / "runs", ["sizing"], SMALL)
    assert not result.failures
    got = result.headlines.set_index("id").reproduced
    assert got["A6.kv_bytes_minimax"] == 126_976
    assert got["A6.tokens_1h"] == pytest.approx(15.12)
    assert round(got["A7.dwpd_raid10"], 2) == 3.21
    assert round(got["B8.cbound_tlc"], 1) == 14.4
    figures = sorted(p.name for p in (tmp_path / "fig").iterdir())
    assert "A6-kv-capacity.png" in figures and "B8-endurance-capacity.svg" in figures
    assert (result.run_dir / "01_sizing_endurance.ipynb").exists()
    saved = pd.read_csv(result.run_dir / "headline_numbers.csv")
    assert len(saved) == len(result.headlines)


def test_bad_parameter_names_notebook_cell_and_parameter(tmp_path) -> None:
    result = reproduce(NOTEBOOKS, tmp_path / "fig", tmp_path / "runs", ["sizing"],
                       {**SMALL, "raid_level": "RAID7"})
    [failure] = result.failures
    text = str(failure)
    assert "01_sizing_endurance.ipynb" in text and "cell" in text
    assert "raid_level" in text and "RAID7" in text


def test_unknown_override_is_rejected(tmp_path) -> None:
    with pytest.raises(ValueError, match="raid_levle"):
        reproduce(NOTEBOOKS, tmp_path, tmp_path, ["sizing"], {"raid_levle": "RAID0"})


def test_cli_failure_exit_code_and_message(tmp_path, capsys) -> None:
    nb_dir = tmp_path / "nbs"
    nb_dir.mkdir()
    shutil.copy(NOTEBOOKS / "01_sizing_endurance.ipynb", nb_dir)
    code = cli.main(["reproduce", "--notebooks", str(nb_dir), "--figures", str(tmp_path / "f"),
                     "--runs", str(tmp_path / "r"), "-p", "model=GPT-9"])
    assert code == 1
    err = capsys.readouterr().err
    assert "FAILED: notebook 01_sizing_endurance.ipynb failed in cell" in err
    assert "unknown model 'GPT-9'" in err


def test_workload_notebook_matches_package(tmp_path) -> None:
    from kvrepro.workload import AgenticSpec, generate_agentic, load_workload, resumes_in_window

    params = {"duration_s": 1800.0, "seed": 5, "workload_dir": str(tmp_path / "wl")}
    result = reproduce(NOTEBOOKS, tmp_path / "fig", tmp_path / "runs", ["workload"], params)
    assert not result.failures
    expected = generate_agentic(AgenticSpec(seed=5, duration_s=1800.0))
    printed = result.executed[0].read_text()  # a table, not a headline row (issue 37)
    assert f"resumes in window {len(resumes_in_window(expected))}" in printed
    assert load_workload(tmp_path / "wl").digest() == expected.digest()
    assert (tmp_path / "fig" / "workload-context-growth.png").exists()


def test_store_checked_outputs_updates_only_checked_cells(tmp_path) -> None:
    import nbformat

    from kvrepro.reproduce import store_checked_outputs

    source = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("x = 1", id="plain"),
        nbformat.v4.new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(x)", id="checked")])
    ran = nbformat.reads(nbformat.writes(source), as_version=4)
    ran.cells[0].outputs = [nbformat.v4.new_output("stream", text="ignored\n")]
    ran.cells[1].outputs = [nbformat.v4.new_output("stream", text="targets met: 8 of 19\n")]
    ran.cells[1].execution_count = 7
    nbformat.write(source, tmp_path / "src.ipynb")
    nbformat.write(ran, tmp_path / "ran.ipynb")
    assert store_checked_outputs(tmp_path / "ran.ipynb", tmp_path / "src.ipynb") == 1
    stored = nbformat.read(tmp_path / "src.ipynb", as_version=4)
    assert stored.cells[0].outputs == []
    assert stored.cells[1].outputs[0]["text"] == "targets met: 8 of 19\n"
    assert stored.cells[1].execution_count == 7  # nbval skips a checked cell without one
