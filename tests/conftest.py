"""Shared fixtures: close every matplotlib figure a test opens; a small notebook maker for the
tests of `kvrepro reproduce`."""

from collections.abc import Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


@pytest.fixture(autouse=True)
def _close_figures() -> Iterator[None]:
    yield
    plt.close("all")


def write_notebook(path: Path, code: str, **kvrepro_metadata: str) -> None:
    """A notebook with papermill parameters (`figures_dir`, `results_dir`) and one code cell,
    as `kvrepro reproduce` runs the shipped ones; `kvrepro_metadata` goes under "kvrepro"."""
    params = nbformat.v4.new_code_cell('figures_dir = ""\nresults_dir = ""')
    params.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[params, nbformat.v4.new_code_cell(code)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    if kvrepro_metadata:
        nb.metadata["kvrepro"] = kvrepro_metadata
    nbformat.write(nb, str(path))
