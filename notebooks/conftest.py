"""nbval's notebooks run with `KVREPRO_STRICT_FIGURES=1` (`kvrepro.plots.legibility`:
`save_figure` refuses a figure whose texts overlap or are cut off), on their defaults, which
are what `make reproduce` draws. Set only while a notebook's kernel starts (nbval starts it in
the setup of the notebook's first cell; the kernel keeps the environment it started with):
`make test` runs the notebooks and the tests in one pytest, and the tests that run a notebook
on small parameters only warn."""

import os
from collections.abc import Iterator

import pytest

from kvrepro.plots.legibility import STRICT_ENV


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    before = os.environ.get(STRICT_ENV)
    os.environ[STRICT_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(STRICT_ENV, None)
        else:
            os.environ[STRICT_ENV] = before
