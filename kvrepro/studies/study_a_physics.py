"""Study A with what it states held fixed: which of its orderings the twin keeps, the
arithmetic that shows where a stated fact forces a miss, and what each freed parameter moves.

Notebook 04 shows all three. Why computed here rather than written into the notebook's text:
each number is read from the study's reference table, the server spec and the run the
figures come from, so a model change that makes an explanation stop holding shows it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from kvrepro.calibration.calibrate import load_plan
from kvrepro.engines.sim.config import sim_profile
from kvrepro.studies.reference import load_reference
from kvrepro.tier_spec import ServerSpec, override_server

TIERS = ("baseline", "dram", "flash")
"""Study A's tiers, by the names its plan and server give them."""
BASELINE, DRAM, FLASH = TIERS
TTFT_HIGH_S = 10.0
"""A4: "baseline crosses 10 s early in the run"."""
DRAM_BOUND_S = 1.0
"""A4: "DRAM stays under 1 s until its fill"."""


def _first_past(ttft: pd.DataFrame, tier: str, limit_s: float) -> float:
    rows = ttft[(ttft["tier"] == tier) & (ttft["ttft_median_s"] > limit_s)]
    return float(rows["bin_start_s"].min()) if len(rows) else math.inf


def _second_half(ttft: pd.DataFrame, run_s: float) -> pd.Series:
    late = ttft[ttft["bin_start_s"] >= run_s / 2]
    return late.groupby("tier")["ttft_median_s"].median()


def _in_order(values: Mapping[str, float], order: tuple[str, ...]) -> bool:
    return all(values[a] < values[b] for a, b in zip(order, order[1:], strict=False))


def orderings(ttft: pd.DataFrame, resumes: pd.DataFrame, fill_s: float, run_s: float
              ) -> pd.DataFrame:
    """The study's orderings of A4 and A5, each `holds` or not on the twin's curves, with
    the numbers that decide it. `ttft`: `study_a_ttft`; `resumes`: `study_a_resumes`."""
    first = {t: _first_past(ttft, t, TTFT_HIGH_S) for t in TIERS}
    before = ttft[(ttft["tier"] == DRAM) & (ttft["bin_start_s"] < fill_s)]
    dram_max = float(before["ttft_median_s"].max()) if len(before) else math.nan
    late = _second_half(ttft, run_s)
    res = resumes.set_index("tier")
    med, top = res["resume_ttft_median_s"], res["resume_ttft_max_s"]
    order = (DRAM, FLASH, BASELINE)
    rows = [
        ("A4", "the baseline passes 10 s first",
         first[BASELINE] < min(first[DRAM], first[FLASH]),
         ", ".join(f"{t} {v / 60:.0f} min" if math.isfinite(v) else f"{t} never"
                   for t, v in first.items())),
        ("A4", "DRAM under 1 s until its fill", dram_max < DRAM_BOUND_S,
         f"DRAM's highest median before {fill_s / 60:.0f} min: {dram_max:.2f} s"),
        ("A4", "flash lowest in the second half", late.idxmin() == FLASH,
         ", ".join(f"{t} {v:.2f} s" for t, v in late.items())),
        ("A5", "resume median: DRAM < flash < baseline", _in_order(med, order),
         ", ".join(f"{t} {med[t]:.2f} s" for t in order)),
        ("A5", "slowest resume: DRAM < flash < baseline", _in_order(top, order),
         ", ".join(f"{t} {top[t]:.2f} s" for t in order)),
    ]
    return pd.DataFrame(rows, columns=["figure", "ordering", "holds", "twin"])


# ------------------------------------------------------------------ the study's arithmetic


def _disk_load_cap_tok_s(spec: ServerSpec) -> tuple[float, float]:
    """(tokens/s, s per chunk) the flash store can load with its reads in flight (the
    twin's FIFO read channel: a chunk costs its latency plus its bytes at the read rate)."""
    profile = sim_profile(spec)
    store = profile.tiers[FLASH].stores[-1]
    kv = spec.model_spec().kv_bytes_per_token
    chunk_s = store.chunk_tokens * kv / store.read_bw_bytes_s + store.chunk_read_latency_s
    return store.chunk_tokens / chunk_s, chunk_s


def _flash_share(records: pd.DataFrame, after_s: float) -> float:
    late = records[(records["tier"] == FLASH) & (records["send_s"] >= after_s)
                   & (records["error"] == "")]
    return float(late["loaded_tokens_flash"].sum() / late["prompt_tokens"].sum())


_HEADLINES_READ = ("A2.baseline_plateau", "A2.dram_after", "A2.dram_retained",
                   "A2.dram_fill_time", "A2.flash_after")


def _page_cache_gb(spec: ServerSpec) -> float:
    host_gb = spec.hardware.host_memory_gb if spec.hardware else None
    if host_gb is None:
        return math.nan
    return host_gb - spec.tiers[FLASH].stores[0].capacity_bytes / 1e9


def page_cache_what_if(spec: ServerSpec) -> ServerSpec:
    """A what-if, not the model: the flash tier's first (host-memory) store as large as the
    page cache its pinned staging leaves of the host's DRAM. Why: LMCache 0.5.0 writes its
    chunk files through the page cache (no O_DIRECT by default), so on a 1 TB host most of
    what the flash tier reads back never reaches the drives. Crude: a page-cache hit still
    costs a file read, which this store prices at the DMA rate."""
    page_cache_gb = _page_cache_gb(spec)
    if math.isnan(page_cache_gb):
        raise ValueError("page_cache_what_if: the server's hardware gives no host_memory_gb")
    return override_server(spec, {f"tiers.{FLASH}.stores.0.capacity_bytes":
                                  page_cache_gb * 1e9})


def stated_arithmetic(spec: ServerSpec, headlines: Mapping[str, float],
                      records: pd.DataFrame, run_s: float) -> pd.DataFrame:
    """Where a stated fact forces a miss: each quantity from the study's own numbers next to
    the twin's (`quantity, formula, study, twin, unit`). `headlines`: `study_a_headlines`
    of the run whose `records` these are."""
    ref = load_reference()["value"]
    h = {k: headlines.get(k, math.nan) for k in _HEADLINES_READ}  # a short run lacks some
    kv = spec.model_spec().kv_bytes_per_token
    dram_bytes = spec.tiers[DRAM].stores[0].capacity_bytes
    fill_rate = dram_bytes / kv / (ref["A2.dram_fill_time"] * 60)
    twin_fill_rate = dram_bytes / kv / (h["A2.dram_fill_time"] * 60)
    dram_peak = ref["A2.dram_after"] / (ref["A2.dram_retained"] / 100)
    twin_dram_peak = h["A2.dram_after"] / (h["A2.dram_retained"] / 100)
    cap_tok_s, chunk_s = _disk_load_cap_tok_s(spec)
    share = _flash_share(records, run_s / 2)
    rows = [
        ("baseline implied by DRAM's gain", "dram_after / dram_retained / dram_peak_gain",
         dram_peak / ref["A2.dram_peak_gain"], h["A2.baseline_plateau"], "tok/s"),
        ("baseline implied by flash's gain", "flash_after / flash_retained / flash_peak_gain",
         ref["A2.flash_after"] / (ref["A2.flash_retained"] / 100) / ref["A2.flash_peak_gain"],
         h["A2.baseline_plateau"], "tok/s"),
        ("baseline plateau as stated", "A2.baseline_plateau", ref["A2.baseline_plateau"],
         h["A2.baseline_plateau"], "tok/s"),
        ("DRAM tier's peak", "dram_after / dram_retained", dram_peak, twin_dram_peak, "tok/s"),
        ("new KV written until the fill", "512 GB / KV bytes per token / fill time",
         fill_rate, twin_fill_rate, "tok/s"),
        ("tokens sent per token of KV written", "DRAM peak / that rate",
         dram_peak / fill_rate, twin_dram_peak / twin_fill_rate, "ratio"),
        ("fill time at A7's write rate", "512 GB / (A7.write_rate / 2, RAID10 mirrors)",
         dram_bytes / (ref["A7.write_rate"] * 1e9 / 2) / 60, h["A2.dram_fill_time"], "min"),
        ("flash load cap, one read in flight", "chunk / (read latency + chunk / 114 GB/s)",
         math.nan, cap_tok_s, "tok/s"),
        ("flash tier's level after the crossover", "A2.flash_after", ref["A2.flash_after"],
         h["A2.flash_after"], "tok/s"),
        ("its prompt tokens read from flash", "twin: second half; study: A8 read / level",
         100 * ref["A8.peak_read"] * 1e9 / kv / ref["A2.flash_after"], 100 * share, "%"),
        ("one chunk's read", "read latency + chunk / read rate", math.nan, 1e3 * chunk_s,
         "ms"),
        ("host DRAM the flash tier's pinned staging leaves to the page cache",
         "host memory - staging (LMCache writes its chunk files buffered)",
         _page_cache_gb(spec), math.nan, "GB"),
    ]
    return pd.DataFrame(rows, columns=["quantity", "formula", "study", "twin", "unit"])


# ------------------------------------------------------------------ what each freed parameter moves


def free_parameter_effects(plan_path: str | Path) -> pd.DataFrame:
    """Each free parameter of the plan at its fitted value and its extreme candidates, the
    others at their fitted values: the fitted targets it is declared to move, as the
    calibration recorded them (`calibration.result.effects`, written by `kvrepro calibrate`;
    a test reruns one to keep it from going stale). Tidy: parameter, value, fitted (bool),
    target, reproduced, study."""
    plan = load_plan(plan_path)
    ref = load_reference()["value"]
    result = plan.calibration.result
    fitted = {name: str(value) for name, value in result.get("values", {}).items()}
    rows = [{"parameter": name, "value": value, "fitted": value == fitted.get(name),
             "target": target, "reproduced": reproduced, "study": float(ref[target])}
            for name, moved in result.get("effects", {}).items()
            for value, targets in moved.items() for target, reproduced in targets.items()]
    return pd.DataFrame(rows, columns=["parameter", "value", "fitted", "target", "reproduced",
                                       "study"])
