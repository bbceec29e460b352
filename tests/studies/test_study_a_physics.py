"""Study A with its stated facts fixed (kvrepro.studies.study_a_physics): the orderings read
off the curves, the study's own arithmetic, and what each freed parameter moves."""

from __future__ import annotations

import pandas as pd
import pytest

from kvrepro._paths import data_file
from kvrepro.calc.gpu_rates import load_constants
from kvrepro.calibration.calibrate import extreme_candidates, load_plan
from kvrepro.studies import study_a_physics as phys
from kvrepro.studies.study_a import STUDY_A_PLAN
from kvrepro.studies.study_a_fit import campaign_headlines
from kvrepro.tier_spec import load_server

TIERS = ("baseline", "dram", "flash")


def _ttft(values: dict[str, list[float]], bin_s: float = 600.0) -> pd.DataFrame:
    return pd.DataFrame([{"tier": t, "bin_start_s": i * bin_s, "ttft_median_s": v}
                         for t, vs in values.items() for i, v in enumerate(vs)])


def _resumes(median: dict[str, float], top: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame([{"tier": t, "resume_ttft_median_s": median[t],
                          "resume_ttft_max_s": top[t]} for t in TIERS])


STUDYS_SHAPE = {"baseline": [0.5, 12.0, 30.0, 40.0], "dram": [0.5, 0.6, 5.0, 9.0],
                "flash": [0.5, 0.7, 1.0, 1.1]}


def test_the_studys_shape_holds_every_ordering() -> None:
    table = phys.orderings(_ttft(STUDYS_SHAPE), _resumes(
        {"dram": 0.6, "flash": 0.8, "baseline": 1.4}, {"dram": 0.8, "flash": 3.2,
                                                      "baseline": 13.9}), 1200.0, 2400.0)
    assert table["holds"].all(), table


def test_each_ordering_fails_when_its_numbers_turn() -> None:
    """The guard: break what each row reads and that row (only) fails."""
    shape = {t: list(v) for t, v in STUDYS_SHAPE.items()}
    shape["flash"][1] = 11.0  # flash passes 10 s as early as the baseline
    shape["dram"][0] = 1.5  # DRAM above 1 s before its fill
    median = {"dram": 0.9, "flash": 0.8, "baseline": 1.4}
    table = phys.orderings(_ttft(shape), _resumes(median, {"dram": 0.8, "flash": 3.2,
                                                           "baseline": 13.9}), 1200.0, 2400.0)
    assert dict(zip(table["ordering"], table["holds"], strict=True)) == {
        "the baseline passes 10 s first": False, "DRAM under 1 s until its fill": False,
        "flash lowest in the second half": True,
        "resume median: DRAM < flash < baseline": False,
        "slowest resume: DRAM < flash < baseline": True}


def _records(flash_share: float) -> pd.DataFrame:
    return pd.DataFrame({"tier": ["flash"] * 2, "send_s": [4000.0, 5000.0], "error": ["", ""],
                         "prompt_tokens": [1000, 1000],
                         "loaded_tokens_flash": [1000 * flash_share] * 2})


def test_the_arithmetic_is_the_studys_numbers_and_the_spec() -> None:
    spec = load_server(data_file("servers", "study_a.yaml"))
    headlines = {"A2.baseline_plateau": 14500.0, "A2.dram_after": 50000.0,
                 "A2.dram_retained": 90.0, "A2.dram_fill_time": 50.0, "A2.flash_after": 25000.0}
    table = phys.stated_arithmetic(spec, headlines, _records(0.5), 5400.0).set_index(
        "quantity")
    assert table.at["baseline implied by DRAM's gain", "study"] == pytest.approx(
        17000 / 0.42 / 2.9)
    kv = 126_976  # the stated FP8 KV: the spec's model, not a fit
    assert table.at["new KV written until the fill", "study"] == pytest.approx(
        512e9 / kv / 2700)
    assert table.at["new KV written until the fill", "twin"] == pytest.approx(512e9 / kv / 3000)
    assert table.at["fill time at A7's write rate", "study"] == pytest.approx(
        512e9 / 0.95e9 / 60)
    assert table.at["its prompt tokens read from flash", "twin"] == pytest.approx(50.0)
    chunk_s = 256 * kv / 114e9 + load_constants().value("fs_read_latency_s")
    assert table.at["one chunk's read", "twin"] == pytest.approx(1e3 * chunk_s)
    assert table.at["flash load cap, one read in flight", "twin"] == pytest.approx(
        256 / chunk_s)
    assert table.at["host DRAM the flash tier's pinned staging leaves to the page cache",
                    "study"] == pytest.approx(1024 - 64)


def test_each_freed_parameters_recorded_effect_is_what_the_twin_gives() -> None:
    """The effects the calibration recorded (its fitted value and its ends, the others at
    the fit) are shown as they are, and rerunning one reproduces it: the record is not
    stale."""
    plan = load_plan(STUDY_A_PLAN)
    table = phys.free_parameter_effects(STUDY_A_PLAN)
    assert set(table["parameter"]) == {p.name for p in plan.calibration.parameters}
    fitted = table[table["fitted"]].groupby("parameter")["value"].nunique()
    assert fitted.eq(1).all() and len(fitted) == len(plan.calibration.parameters)
    for param in plan.calibration.parameters:
        ends = {str(v) for v in extreme_candidates(param.values)}
        assert set(table[table["parameter"] == param.name]["value"]) >= ends
    row = table[(table["parameter"] == "p_returning") & (table["value"] == "0.2")]
    again = campaign_headlines(STUDY_A_PLAN, {"p_returning": 0.2}, plan.calibration.seed)
    assert row["reproduced"].iloc[0] == pytest.approx(again["A5.resumes"])


def test_the_page_cache_what_if_sizes_the_staging_from_the_stated_host_memory() -> None:
    spec = load_server(data_file("servers", "study_a.yaml"))
    what_if = phys.page_cache_what_if(spec)
    assert what_if.tiers["flash"].stores[0].capacity_bytes == pytest.approx((1024 - 64) * 1e9)
    assert spec.tiers["flash"].stores[0].capacity_bytes == 64e9  # the spec is not changed
    no_host = spec.model_copy(update={"hardware": spec.hardware.model_copy(
        update={"host_memory_gb": None})})
    with pytest.raises(ValueError, match="host_memory_gb"):
        phys.page_cache_what_if(no_host)
