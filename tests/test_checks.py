"""The one missing-columns check (`kvrepro._checks.require_columns`) and the callers that
name themselves through it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from kvrepro import analysis
from kvrepro._checks import require_columns
from kvrepro.calc import economics
from kvrepro.engines.live.metrics import counter_rates
from kvrepro.plots import run_figures
from kvrepro.records import read_run
from kvrepro.workload import AgenticSpec, generate_agentic
from kvrepro.workload.base import load_workload, save_workload


def test_passes_when_every_column_is_there() -> None:
    require_columns(pd.DataFrame({"a": [1], "b": [2]}), ["b", "a"], "f")
    require_columns(pd.DataFrame(), [], "f")


def test_names_the_caller_and_every_missing_column_in_order() -> None:
    df = pd.DataFrame({"a": [1], "c": [3]})
    with pytest.raises(ValueError) as err:
        require_columns(df, ["d", "a", "b", "c"], "my_function")
    assert str(err.value) == "my_function: data lacks column(s) ['d', 'b']"
    with pytest.raises(ValueError, match=r"^x: data lacks column\(s\) \['a'\]$"):
        require_columns(pd.DataFrame({"b": []}), iter(["a"]), "x")  # any iterable


def _lacks(what: str, *columns: str) -> str:
    return "^" + re.escape(f"{what}: data lacks column(s) {list(columns)}") + "$"


def test_callers_report_through_it(tmp_path: Path) -> None:
    binned = pd.DataFrame({"tier": ["dram"], "bin_start_s": [0.0], "bin_end_s": [60.0]})
    with pytest.raises(ValueError, match=_lacks("binned throughput", "total_tok_s")):
        analysis.peak(binned)
    with pytest.raises(ValueError, match=_lacks("tokens_per_dollar", "total_tok_s")):
        economics.tokens_per_dollar(binned, pd.DataFrame({"tier": ["dram"]}))
    with pytest.raises(ValueError, match=_lacks("figure A2", "total_tok_s")):
        run_figures.a2_total_throughput(binned)
    with pytest.raises(ValueError, match=_lacks("counter_rates", "time_s", "preemptions")):
        counter_rates(pd.DataFrame({"running": [1]}), ["preemptions"])

    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text("")
    (run / "samples.jsonl").write_text(json.dumps({"running": 1}) + "\n")
    with pytest.raises(ValueError, match=_lacks(str(run / "samples.jsonl"), "time_s")):
        read_run(run)

    folder = save_workload(generate_agentic(AgenticSpec(seed=0, duration_s=60)),
                           tmp_path / "wl")
    turns = pd.read_parquet(folder / "turns.parquet").drop(columns=["pause_s"])
    turns.to_parquet(folder / "turns.parquet")
    with pytest.raises(ValueError, match=_lacks(str(folder / "turns.parquet"), "pause_s")):
        load_workload(folder)
