"""The studies' headline numbers, and putting a reproduced number next to its reference.

Reference values are only ever compared against; no computation in kvrepro reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import pandas as pd

from kvrepro._paths import data_file
from kvrepro.studies.provenance import headline_kinds

HEADLINE_COLUMNS = ["id", "figure", "quantity", "unit", "study", "reproduced", "rel_diff_pct",
                    "kind", "why", "source", "bound"]
BOUNDS = {"upper bound": "at most", "lower bound": "at least"}
"""A reference row whose note starts so states a bound, not a value (`bound` column): the
reproduced number meets it or lies beyond it by `rel_diff_pct`; 0 where it meets it, so a
number well inside the bound (a spread of 0 % under "at most 1 %") never reads as a miss."""


def bound_of(note: object) -> str:
    """"at most", "at least" or "" for a reference row's note."""
    text = str(note) if isinstance(note, str) else ""
    return next((b for prefix, b in BOUNDS.items() if text.startswith(prefix)), "")


def _rel_diff_pct(value: float, study: float, bound: str) -> float:
    """Relative difference in % of the study's value; for a bound, only the excess beyond it."""
    if not study:
        return float("nan")
    rel = (value - study) / abs(study) * 100
    if (bound == "at most" and rel <= 0) or (bound == "at least" and rel >= 0):
        return 0.0
    return rel


@lru_cache(maxsize=1)
def load_reference() -> pd.DataFrame:
    """All reference numbers (`data/reference/reference_numbers.csv`), indexed by id."""
    return pd.read_csv(data_file("reference", "reference_numbers.csv")).set_index("id")


def compare(reproduced: Mapping[str, float], source: str = "",
            kind: str | Mapping[str, str] | None = None) -> pd.DataFrame:
    """Table of reproduced numbers next to the study's, with the relative difference in %
    and each number's provenance (`kind`, `why`: see `kvrepro.studies.provenance`).

    `reproduced` maps reference ids (e.g. "A7.dwpd_raid10") to values in the reference's unit.
    An unknown id is an error, so a typo cannot silently drop a number from the comparison.
    `kind` (one for all, or per id) overrides the registry's, e.g. "measured" for numbers
    of this machine's drive.
    """
    ref = load_reference()
    unknown = sorted(set(reproduced) - set(ref.index))
    if unknown:
        raise KeyError(f"unknown reference id(s) {unknown}; "
                       "see data/reference/reference_numbers.csv")
    rows = []
    kinds = headline_kinds(list(reproduced), kind)
    for (ref_id, value), (row_kind, why) in zip(reproduced.items(), kinds, strict=True):
        study, bound = float(ref.at[ref_id, "value"]), bound_of(ref.at[ref_id, "note"])
        rows.append({"id": ref_id, "figure": ref.at[ref_id, "figure"],
                     "quantity": ref.at[ref_id, "quantity"], "unit": ref.at[ref_id, "unit"],
                     "study": study, "reproduced": float(value),
                     "rel_diff_pct": _rel_diff_pct(float(value), study, bound),
                     "kind": row_kind, "why": why, "source": source, "bound": bound})
    return pd.DataFrame(rows, columns=HEADLINE_COLUMNS)


def save_headline(table: pd.DataFrame, results_dir: str | Path | None, name: str) -> Path | None:
    """Write a notebook's headline table to `results_dir/<name>.csv` (no-op without a folder).

    `kvrepro reproduce` passes `results_dir` to every notebook and gathers these files into
    the final table; interactive runs leave it unset.
    """
    if results_dir is None or results_dir == "":
        return None
    path = Path(results_dir) / f"{name}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False)
    return path


class DuplicateHeadline(ValueError):
    """An id produced twice: one id has one value and one kind in the headline table."""


def collect_headlines(results_dir: str | Path) -> pd.DataFrame:
    """Concatenate every headline CSV in `results_dir`, ordered by figure id. An id in more
    than one row (two notebooks, or one twice) is refused (`DuplicateHeadline`): the table
    would show two values, maybe of two kinds, for one study number (A5.resumes once came
    from the workload alone in notebook 02 and from the twin in notebook 04)."""
    files = sorted(Path(results_dir).glob("*.csv"))
    if not files:
        return pd.DataFrame(columns=HEADLINE_COLUMNS)
    table = pd.concat([pd.read_csv(f).assign(_file=f.name) for f in files], ignore_index=True)
    twice = table[table["id"].duplicated(keep=False)].groupby("id", sort=True)["_file"]
    if len(twice):
        named = "; ".join(f"{ref_id} from {', '.join(names)}"
                          for ref_id, names in twice.agg(list).items())
        raise DuplicateHeadline(f"headline id(s) produced more than once: {named} (in "
                                f"{results_dir}): one id, one value, one kind; give the other "
                                "quantity its own id or show it as a table")
    table = table.drop(columns="_file")
    return table.sort_values(["figure", "id"], kind="stable").reset_index(drop=True)


def format_number(value: float) -> str:
    """A number as the headline tables show it: thousands whole with separators, else four
    significant digits."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"



_BOUND_SIGN = {"at most": "<= ", "at least": ">= "}


def diff_text(rel_diff_pct: float, bound: str = "") -> str:
    """A difference as shown: "+4.2 %", or for a bound "meets it" / "+4.2 % beyond"."""
    if bound and rel_diff_pct == 0:
        return "meets bound"
    text = f"{rel_diff_pct:+.1f} %"
    return f"{text} beyond" if bound else text


def format_headlines(table: pd.DataFrame) -> str:
    """Plain-text table for the terminal: id, study value, reproduced value, difference,
    kind."""
    if table.empty:
        return "(no headline numbers were produced)"
    bounds = table["bound"].fillna("") if "bound" in table else pd.Series("", table.index)
    shown = table.assign(
        study=[f"{_BOUND_SIGN.get(b, '')}{format_number(v)}"
               for v, b in zip(table.study, bounds, strict=True)],
        reproduced=table.reproduced.map(format_number),
        rel_diff_pct=[diff_text(v, b) for v, b in zip(table.rel_diff_pct, bounds, strict=True)])
    columns = ["id", "unit", "study", "reproduced", "rel_diff_pct", "kind", "source"]
    return shown[[c for c in columns if c in shown]].to_string(index=False)
