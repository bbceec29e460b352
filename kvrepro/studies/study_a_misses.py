"""Why a predicted study-A target is missed: one line per miss, with the number from the run
that shows it (notebook 04's "what does not match" table, the report).

Each reason is a rule about the model or the study's data, written once here, and its number
is computed from the same simulated records the headline came from, so a reason that stops
holding shows a number that no longer supports it. A miss with no rule says so ("no reason
recorded"), so a new miss cannot hide behind an old explanation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from kvrepro.studies.reference import load_reference

Evidence = Callable[[pd.DataFrame, Mapping[str, float], Mapping[str, Any]], tuple[str, float]]


def _normal(records: pd.DataFrame, tier: str, after_s: float = 0.0) -> pd.DataFrame:
    ok = records[(records["tier"] == tier) & (records["error"] == "")
                 & ~records["is_warmup"].astype(bool) & (records["send_s"] >= after_s)]
    return ok[~ok["is_resume"].astype(bool)]


def _cached_phase(records, headlines, context):
    part = records[(records["send_s"] < context["early_window_s"]) & (records["error"] == "")
                   & ~records["is_warmup"].astype(bool) & ~records["is_resume"].astype(bool)]
    new = (part["prompt_tokens"] - part["cached_prompt_tokens"]).median()
    return (f"while VRAM holds there is no queue and no load: a normal turn's prompt has a "
            f"median of {new:,.0f} new tokens, whose prefill is tens of ms on the study's "
            "GPUs; 0.5 s is not a prefill, a load or a queue at the stated load (notebook 04, "
            "TTFT parts). Median queue wait (s):", float(part["queue_s"].median()))


def _flash_loads(records, headlines, context):
    late = _normal(records, context["flash"], context["half_s"])
    return ("the flash tier is bound by LMCache 0.5.0's disk path: one chunk read at a time, "
            "each the shared per-read latency plus its bytes at the array's rate, while "
            "nearly every late prompt token comes off flash (the study's arithmetic table), "
            "so a late turn waits for the loads queued ahead of it. Median load + queue time "
            "of a flash turn in the second half (s):",
            float((late["load_s"] + late["queue_s"]).median()))


def _dram_after_fill(records, headlines, context):
    after = _normal(records, context["dram"], context["dram_fill_s"])
    recomputed = 100 * (after["prompt_tokens"] - after["cached_prompt_tokens"]).sum() / \
        after["prompt_tokens"].sum()
    return ("after its fill the twin's DRAM tier still holds what the sessions come back for "
            "(LRU evicts first the chunks of contexts compacted at 64K, which nobody reads "
            "again), so it keeps its rate and its resumes, where the study's fell to 42 % of "
            "its peak: the study's live contexts outgrew 512 GB of FP8 KV, the twin's at the "
            "stated rules do not. Share of prompt tokens the DRAM tier recomputes after the "
            "fill (%):", float(recomputed))


def _dram_resumes(records, headlines, context):
    part = records[(records["tier"] == context["dram"]) & records["is_resume"].astype(bool)
                   & (records["error"] == "") & ~records["is_warmup"].astype(bool)]
    return ("a DRAM resume loads its context over pinned DMA (4 links at the shared "
            "efficiency: tens of ms for 60K tokens of FP8 KV) and prefills its new tokens, "
            "so its median is under the study's; its slowest is the one that waits behind "
            "other loads and prefills. Median load time of the DRAM tier's resumes (s):",
            float(part["load_s"].median()))


def _capped_queue(records, headlines, context):
    cap = context["max_in_flight"]
    return (f"the client's in-flight cap ({cap}; None: none) decides where the queue builds: "
            "in the client, whose wait TTFT does not count, or in the server. The study's "
            "1.4 s baseline resume median asks for a cap, its A4 (past 10 s) for none. "
            "Baseline's highest binned median in the first half (s):",
            float(headlines.get("A4.baseline_ttft_high", float("nan"))))


def _baseline_resumes(records, headlines, context):
    part = records[(records["tier"] == context["baseline"]) & records["is_resume"].astype(bool)
                   & (records["error"] == "")]
    return ("a baseline resume recomputes its whole context behind the queue; median queue "
            "wait of the baseline's resumes (s):", float(part["queue_s"].median()))


def _baseline_recompute(records, headlines, context):
    late = _normal(records, context["baseline"], context["half_s"])
    new = (late["prompt_tokens"] - late["cached_prompt_tokens"]).median()
    return ("once VRAM is full the baseline recomputes what it evicted, so a normal turn's "
            "prefill is of thousands of tokens, not hundreds; median new (recomputed) tokens "
            "of a baseline normal turn in the second half:", float(new))


def _output_share(records, headlines, context):
    ref = load_reference()["value"]
    study = 100 * ref["A3.flash_output"] / ref["A2.flash_after"]
    twin = 100 * headlines["A3.flash_output"] / headlines["A2.flash_after"]
    return (f"output is {study:.2f} % of the study's flash plateau (250 of 30,000 tok/s) and "
            "the twin's turns have the study's output lengths, so the twin's output follows "
            "its total; the study's baseline output (~171 tok/s, implied_baseline) does not "
            "fit its own total. Twin output share of the flash plateau (%):", float(twin))


MISS_REASONS: dict[str, Evidence] = {
    "A4.ttft_cached": _cached_phase,
    "A5.normal_ttft_dram": _cached_phase,
    "A5.normal_ttft_flash": _flash_loads,
    "A5.resume_median_flash": _flash_loads,
    "A5.resume_max_flash": _flash_loads,
    "A4.flash_late_ratio": _flash_loads,
    "A2.dram_after": _dram_after_fill,
    "A2.dram_retained": _dram_after_fill,
    "A4.baseline_ttft_high": _capped_queue,
    "A5.resume_median_baseline": _baseline_resumes,
    "A5.resume_max_baseline": _baseline_resumes,
    "A5.normal_ttft_baseline": _baseline_recompute,
    "A5.resume_median_dram": _dram_resumes,
    "A5.resume_max_dram": _dram_resumes,
    "A3.flash_output": _output_share,
    "A3.flash_output_gain": _output_share,
    "A3.dram_peak_output": _output_share,
    "A3.dram_output_gain": _output_share,
}
"""Predicted study-A ids -> the reason they can miss and its evidence (see the module)."""


def explain_misses(table: pd.DataFrame, records: pd.DataFrame,
                   headlines: Mapping[str, float], context: Mapping[str, Any]) -> pd.DataFrame:
    """One row per predicted target `table` (a `check_targets` table) misses: id, study,
    reproduced, why, evidence (the number that shows it). `context`: the run's roles and
    reading (baseline / dram / flash tier names, dram_store, dram_fill_s, half_s,
    early_window_s, max_in_flight)."""
    missed = table[(table["kind"] == "predicted") & (table["met"] == False)]  # noqa: E712
    rows = []
    for row in missed.itertuples():
        rule = MISS_REASONS.get(row.id)
        why, value = (rule(records, headlines, context) if rule is not None
                      else ("no reason recorded", float("nan")))
        rows.append({"id": row.id, "study": row.study, "reproduced": row.reproduced,
                     "why": why, "evidence": value})
    return pd.DataFrame(rows, columns=["id", "study", "reproduced", "why", "evidence"])


MISSES_DIR = "misses"
"""Subfolder of a reproduce run's results/ where a notebook leaves its misses table (apart
from the headline CSVs, which `reference.collect_headlines` gathers from results/ itself)."""


def save_misses(misses: pd.DataFrame, results_dir: str | Path | None, name: str
                ) -> Path | None:
    """Write an `explain_misses` table to `results_dir/misses/<name>.csv` for the report
    (no-op without a folder, as in an interactive run)."""
    if results_dir is None or results_dir == "":
        return None
    path = Path(results_dir) / MISSES_DIR / f"{name}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    misses.to_csv(path, index=False)
    return path
