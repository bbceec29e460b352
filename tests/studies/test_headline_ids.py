"""One headline id, one value, one kind (issue 37, item 9): `kvrepro reproduce` once wrote
A5.resumes twice into headline_numbers.csv, both `fitted` (14 from notebook 02's workload
alone, 10 from notebook 04's twin). The collection now refuses an id two notebooks produce,
and the shipped notebooks that produced a second copy show it as a table instead."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pandas as pd
import pytest

from kvrepro import cli
from kvrepro.reproduce import reproduce
from kvrepro.studies import reference
from tests.conftest import NOTEBOOKS, write_notebook


def _notebook(path: Path, headlines: dict[str, float]) -> None:
    """A notebook that saves `headlines` as its headline rows, as the shipped ones do."""
    write_notebook(path, "from kvrepro.studies import reference\n"
                   f"table = reference.compare({headlines!r}, source={path.stem!r})\n"
                   f"reference.save_headline(table, results_dir or None, {path.stem!r})\n")


def test_an_id_two_notebooks_produce_is_refused(tmp_path: Path, capsys) -> None:
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_workload.ipynb", {"A5.resumes": 14.0})
    _notebook(nbs / "02_twin.ipynb", {"A5.resumes": 10.0, "A6.tokens_1h": 15.12})
    with pytest.raises(ValueError,  # reference.DuplicateHeadline
                       match=r"A5\.resumes from 01_workload\.csv, 02_twin\.csv"):
        reproduce(nbs, tmp_path / "fig", tmp_path / "runs", jobs=1)
    [run_dir] = (tmp_path / "runs").iterdir()
    assert not (run_dir / "headline_numbers.csv").exists()  # no table with two values
    code = cli.main(["reproduce", "--notebooks", str(nbs), "--figures", str(tmp_path / "f"),
                     "--runs", str(tmp_path / "r"), "--jobs", "1"])
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bars
    assert code == 2 and last.startswith("kvrepro reproduce: headline id(s) produced more "
                                         "than once: A5.resumes from")


def test_the_same_id_twice_in_one_results_folder_is_refused(tmp_path: Path) -> None:
    for name, value in (("a", 14.0), ("b", 10.0)):
        reference.save_headline(reference.compare({"A5.resumes": value}), tmp_path, name)
    reference.save_headline(reference.compare({"B8.cbound_tlc": 14.4}), tmp_path, "c")
    with pytest.raises(ValueError) as refused:
        reference.collect_headlines(tmp_path)
    assert "A5.resumes from a.csv, b.csv" in str(refused.value)
    assert "B8" not in str(refused.value)
    (tmp_path / "b.csv").unlink()
    assert list(reference.collect_headlines(tmp_path).id) == ["A5.resumes", "B8.cbound_tlc"]


def test_the_workload_notebook_shows_its_resumes_as_a_table_not_a_headline(
        tmp_path: Path) -> None:
    """Notebook 02's count (the workload alone) is a table; A5.resumes is notebook 04's."""
    result = reproduce(NOTEBOOKS, tmp_path / "fig", tmp_path / "runs", ["workload"],
                       {"duration_s": 1800.0, "seed": 5})
    assert not result.failures
    assert "A5.resumes" not in set(result.headlines.id)
    assert not pd.read_csv(result.run_dir / "headline_numbers.csv").id.duplicated().any()
    executed = nbformat.read(result.executed[0], as_version=4)
    shown = "".join(o.get("data", {}).get("text/plain", "")
                    for c in executed.cells if c.cell_type == "code" for o in c.outputs)
    assert "study A (A5.resumes)" in shown
