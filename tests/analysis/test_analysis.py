"""Analysis of request records, on hand-built runs whose answers are worked out by hand."""

import math

import numpy as np
import pandas as pd
import pytest

from kvrepro import analysis as an
from kvrepro.analysis import runs
from kvrepro.records import RECORD_COLUMNS, RunWriter, read_runs
from kvrepro.studies.reference import load_reference
from kvrepro.studies.study_a_headlines import (
    StudyASettings,
    study_a_headlines,
    study_a_rates,
    study_a_resumes,
    study_a_ttft,
)


def rec(tier="baseline", send_s=0.0, first_token_s=1.0, finish_s=1.0, prompt_tokens=0,
        cached_prompt_tokens=0.0, output_tokens=0, is_resume=False, is_warmup=False,
        error="", session_id=1, turn=0) -> dict:
    return {"session_id": session_id, "turn": turn, "tier": tier, "engine": "sim",
            "send_s": send_s, "first_token_s": first_token_s, "finish_s": finish_s,
            "prompt_tokens": prompt_tokens, "cached_prompt_tokens": cached_prompt_tokens,
            "output_tokens": output_tokens, "is_resume": is_resume, "is_warmup": is_warmup,
            "error": error}


def frame(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(RECORD_COLUMNS))
    return df.assign(ttft_s=df.first_token_s - df.send_s)


def binned(rates: dict[str, list[float]], bin_s: float = 60.0,
           column: str = "total_tok_s") -> pd.DataFrame:
    """A throughput frame with given per-bin rates, as throughput_over_time returns."""
    parts = []
    for tier, values in rates.items():
        starts = np.arange(len(values)) * bin_s
        parts.append(pd.DataFrame({"tier": tier, "bin_start_s": starts,
                                   "bin_end_s": starts + bin_s, column: values}))
    return pd.concat(parts, ignore_index=True)


# ---------------------------------------------------------------- throughput_over_time

def test_request_spanning_two_bins_splits_output_by_overlap() -> None:
    # prompt 600 at t=30 -> bin 0; output 120 over [30, 90]: 60 in each bin.
    df = frame([rec(send_s=10, first_token_s=30, finish_s=90, prompt_tokens=600,
                    cached_prompt_tokens=200.0, output_tokens=120)])
    out = an.throughput_over_time(df, bin_s=60)
    assert list(out.bin_start_s) == [0.0, 60.0]
    assert list(out.bin_end_s) == [60.0, 120.0]
    assert out.output_tok_s.tolist() == pytest.approx([1.0, 1.0])
    assert out.prompt_tok_s.tolist() == pytest.approx([10.0, 0.0])
    assert out.total_tok_s.tolist() == pytest.approx([11.0, 1.0])
    assert out.cached_prompt_tok_s.tolist() == pytest.approx([200 / 60, 0.0])
    assert out.computed_prompt_tok_s.tolist() == pytest.approx([400 / 60, 0.0])


def test_uneven_overlap_and_zero_length_request() -> None:
    # output 100 over [50, 150]: 10 in bin 0, 60 in bin 1, 30 in bin 2;
    # a second request with first token == finish at 130 puts its 12 tokens in bin 2.
    df = frame([rec(first_token_s=50, finish_s=150, output_tokens=100),
                rec(first_token_s=130, finish_s=130, output_tokens=12, prompt_tokens=6)])
    out = an.throughput_over_time(df, bin_s=60)
    assert (out.output_tok_s * 60).tolist() == pytest.approx([10, 60, 42])
    assert (out.prompt_tok_s * 60).tolist() == pytest.approx([0, 0, 6])


def test_failed_requests_count_nothing_and_empty_bins_are_zero() -> None:
    df = frame([rec(first_token_s=10, finish_s=20, prompt_tokens=60, output_tokens=60),
                rec(first_token_s=15, finish_s=25, prompt_tokens=999, output_tokens=999,
                    error="timeout"),
                rec(first_token_s=math.nan, finish_s=30, prompt_tokens=999, error="refused")])
    out = an.throughput_over_time(df, bin_s=60, run_s=240)
    assert len(out) == 4
    assert out.total_tok_s.tolist() == pytest.approx([2.0, 0.0, 0.0, 0.0])


def test_tokens_after_run_end_are_not_counted() -> None:
    # output 120 over [90, 150] with run_s = 120: only the 60 tokens before 120 count.
    df = frame([rec(first_token_s=90, finish_s=150, output_tokens=120),
                rec(first_token_s=130, finish_s=130, prompt_tokens=500)])
    out = an.throughput_over_time(df, bin_s=60, run_s=120)
    assert (out.output_tok_s * 60).tolist() == pytest.approx([0, 60])
    assert out.prompt_tok_s.sum() == 0


def test_unknown_cached_count_makes_its_bin_nan_only() -> None:
    df = frame([rec(first_token_s=10, finish_s=10, prompt_tokens=60, cached_prompt_tokens=30.0),
                rec(first_token_s=70, finish_s=70, prompt_tokens=60,
                    cached_prompt_tokens=math.nan)])
    out = an.throughput_over_time(df, bin_s=60)
    assert out.cached_prompt_tok_s.iloc[0] == pytest.approx(0.5)
    assert out.computed_prompt_tok_s.iloc[0] == pytest.approx(0.5)
    assert math.isnan(out.cached_prompt_tok_s.iloc[1])
    assert math.isnan(out.computed_prompt_tok_s.iloc[1])
    assert out.prompt_tok_s.iloc[1] == pytest.approx(1.0)  # the prompt itself is known


def test_tiers_share_bins_through_a_run_folder(tmp_path) -> None:
    dirs = []
    for tier, finish in (("baseline", 50.0), ("dram", 170.0)):
        with RunWriter(tmp_path / tier, {"tier": tier}) as w:
            w.write_record(rec(tier=tier, first_token_s=40.0, finish_s=finish,
                               prompt_tokens=120, cached_prompt_tokens=60.0,
                               output_tokens=13))
        dirs.append(tmp_path / tier)
    records, _ = read_runs(dirs)
    out = an.throughput_over_time(records, bin_s=60)
    assert out.groupby("tier").size().to_dict() == {"baseline": 3, "dram": 3}
    base = out[out.tier == "baseline"]
    assert base.total_tok_s.tolist() == pytest.approx([133 / 60, 0, 0])


# ---------------------------------------------------------------- ttft, split, resumes

def test_ttft_per_bin_median_and_p90() -> None:
    ttfts = [1.0, 2.0, 3.0, 4.0, 10.0]
    rows = [rec(send_s=5 + i, first_token_s=5 + i + t, finish_s=20 + i)
            for i, t in enumerate(ttfts)]
    rows += [rec(send_s=70, first_token_s=70.5, finish_s=71),
             rec(send_s=75, first_token_s=math.nan, finish_s=80, error="boom"),
             rec(send_s=130, first_token_s=131, finish_s=132, is_warmup=True)]
    out = an.ttft_over_time(frame(rows), bin_s=60)
    assert out.n.tolist() == [5, 1, 1]
    assert out.n_failed.tolist() == [0, 1, 0]
    assert out.ttft_median_s.tolist() == pytest.approx([3.0, 0.5, 1.0])
    # linear interpolation: p90 of [1, 2, 3, 4, 10] = 4 + 0.6 * 6 = 7.6
    assert out.ttft_p90_s.iloc[0] == pytest.approx(7.6)
    assert out.ttft_p99_s.iloc[0] == pytest.approx(4 + 0.96 * 6)
    no_warm = an.ttft_over_time(frame(rows), bin_s=60, exclude_warmup=True)
    assert no_warm.n.tolist() == [5, 1, 0]
    assert math.isnan(no_warm.ttft_median_s.iloc[2])


def test_prompt_split_totals_and_hit_share() -> None:
    rows = [rec(tier="dram", prompt_tokens=1000, cached_prompt_tokens=900.0),
            rec(tier="dram", prompt_tokens=500, cached_prompt_tokens=100.0),
            rec(tier="dram", prompt_tokens=300, cached_prompt_tokens=math.nan),
            rec(tier="dram", prompt_tokens=7000, cached_prompt_tokens=7000.0, error="x"),
            rec(tier="baseline", prompt_tokens=400, cached_prompt_tokens=0.0)]
    out = an.prompt_split(frame(rows)).set_index("tier")
    dram = out.loc["dram"]
    assert dram.n_requests == 3
    assert dram.prompt_tokens == 1800
    assert dram.cached_prompt_tokens == 1000
    assert dram.computed_prompt_tokens == 500
    assert dram.hit_share == pytest.approx(1000 / 1500)
    assert dram.n_cached_unknown == 1
    assert out.loc["baseline"].hit_share == 0


def test_resume_stats_per_tier() -> None:
    rows = [rec(tier="flash", send_s=0, first_token_s=9.0, is_warmup=True),
            rec(tier="flash", send_s=10, first_token_s=10.4),
            rec(tier="flash", send_s=20, first_token_s=20.6),
            rec(tier="flash", send_s=30, first_token_s=30.5),
            rec(tier="flash", send_s=40, first_token_s=40.8, is_resume=True),
            rec(tier="flash", send_s=50, first_token_s=53.2, is_resume=True),
            rec(tier="flash", send_s=60, first_token_s=60.6, is_resume=True),
            rec(tier="flash", send_s=70, first_token_s=math.nan, is_resume=True, error="e")]
    out = an.resume_stats(frame(rows)).set_index("tier").loc["flash"]
    assert out.n_normal == 3
    assert out.normal_ttft_median_s == pytest.approx(0.5)
    assert out.n_resumes == 4
    assert out.n_resumes_failed == 1
    assert out.resume_ttft_median_s == pytest.approx(0.8)
    assert out.resume_ttft_max_s == pytest.approx(3.2)
    with_warmup = an.resume_stats(frame(rows), exclude_warmup=False).iloc[0]
    assert with_warmup.normal_ttft_median_s == pytest.approx(0.55)


# ---------------------------------------------------------------- headline functions

CURVES = {"baseline": [10, 12, 12, 12, 12, 12],
          "dram": [10, 20, 35, 30, 14, 16],
          "flash": [10, 18, 30, 29, 28, 28]}


def test_peak_value_and_time() -> None:
    out = an.peak(binned(CURVES)).set_index("tier")
    assert out.loc["dram"].peak_tok_s == 35
    assert out.loc["dram"].peak_bin_start_s == 120
    assert out.loc["dram"].peak_time_s == 150
    assert out.loc["baseline"].peak_bin_start_s == 60  # ties go to the earliest bin


def test_plateau_default_last_third_and_window() -> None:
    data = binned(CURVES)
    assert an.plateau(data)["dram"] == pytest.approx(15)    # bins 4, 5
    assert an.plateau(data, t0_s=60, t1_s=180)["flash"] == pytest.approx(24)  # bins 1, 2
    assert an.retained_share(data)["dram"] == pytest.approx(15 / 35)
    assert an.retained_share(data)["flash"] == pytest.approx(28 / 30)


def test_late_window_is_the_last_third() -> None:
    assert an.late_window(5400) == (3600, 5400)
    assert an.late_window(90.0) == (60.0, 90.0)
    with pytest.raises(ValueError, match="run_s"):
        an.late_window(0)


def test_late_bins_select_by_bin_centre() -> None:
    data = binned({"dram": [1, 2, 3, 4, 5, 6, 7]})  # 7 bins of 60 s, run end 420
    # the late window is [280, 420]: centres 270 (bin 4) is out, 330 and 390 are in
    assert an.late_bins(data).total_tok_s.tolist() == [6, 7]
    # run_s = 360: window [240, 360], centres 270 and 330 (bins 4, 5) are in, 390 is out
    assert an.late_bins(data, run_s=360).total_tok_s.tolist() == [5, 6]
    assert an.window_bins(data, 90, 150).total_tok_s.tolist() == [2, 3]  # centres 90, 150
    assert an.plateau(data)["dram"] == pytest.approx(6.5)  # the late bins' mean


def test_sweep_summary_late_level_is_the_late_bins_mean() -> None:
    from types import SimpleNamespace

    from kvrepro.studies.whatif import WhatIfRead, saturation_headlines

    # one request per 300 s bin over 2700 s (9 bins), first token == finish at the centre:
    # bin i runs at 1 + i + 1/300 tok/s; a 3-bin median of a rising curve keeps every inner
    # bin and averages the two values of each end bin; the late bins are 6, 7, 8
    rows = [rec(tier="dram", send_s=150 + 300 * i, first_token_s=150 + 300 * i,
                finish_s=150 + 300 * i, output_tokens=300 * (1 + i), prompt_tokens=1)
            for i in range(9)]
    run = SimpleNamespace(records=frame(rows), samples=pd.DataFrame({"time_s": [0.0]}),
                          meta={"stats": {}})
    read = WhatIfRead(StudyASettings(bin_s=300.0, run_s=2700.0, smooth_bins=3), "")
    got = saturation_headlines(run, read)
    smoothed = [1 + i + 1 / 300 for i in range(9)]
    smoothed[0], smoothed[-1] = smoothed[0] + 0.5, smoothed[-1] - 0.5  # partial windows
    assert got["late_tok_s"] == pytest.approx(sum(smoothed[6:]) / 3)


def test_gain_over_baseline_uses_the_baseline_in_the_peak_bin() -> None:
    data = binned({"baseline": [10, 12, 14, 20], "dram": [10, 20, 35, 21]})
    gains = an.gain_over_baseline_at_peak(data)
    assert list(gains.index) == ["dram"]
    assert gains["dram"] == pytest.approx(35 / 14)   # not 35 / 20 (baseline's own peak)


def test_smoothing_changes_peak_and_is_centred() -> None:
    data = binned({"dram": [0, 10, 100, 10, 10, 0]})
    smoothed = an.smooth_rates(data, 3)
    assert smoothed.total_tok_s.tolist() == pytest.approx([5, 10, 10, 10, 10, 5])
    assert an.peak(data, smooth_bins=3).peak_tok_s.iloc[0] == pytest.approx(10)
    means = an.smooth_rates(data, 3, how="mean").total_tok_s.tolist()
    assert means[2] == pytest.approx(40)


def test_crossover_respects_hold() -> None:
    data = binned({"dram": [10, 10, 30, 30, 30, 20, 15, 15, 15],
                   "flash": [10, 11, 25, 25, 25, 25, 25, 25, 25]})
    # flash > dram in bin 1 only (a blip), then from bin 5 on (4 bins = 240 s).
    assert an.crossover_time_s(data, "flash", "dram", hold_s=0) == 60
    assert an.crossover_time_s(data, "flash", "dram", hold_s=120) == 300
    assert an.crossover_time_s(data, "flash", "dram", hold_s=240) == 300
    assert math.isnan(an.crossover_time_s(data, "flash", "dram", hold_s=241))


def test_early_spread_is_max_relative_spread_in_window() -> None:
    data = binned({"baseline": [100, 200, 900], "dram": [101, 198, 10],
                   "flash": [99, 202, 500]})
    # bin 0: 2 / 100; bin 1: 4 / 200; bin 2 lies outside the 120 s window.
    assert an.early_spread(data, window_s=120) == pytest.approx(0.02)
    assert an.early_spread(data, window_s=180) > 0.5


def test_fill_time_without_counters_is_the_first_sample_holding_whole_chunk_capacity() -> None:
    # live-like samples: bytes used only
    samples = pd.DataFrame({"time_s": [0, 30, 60, 90, 0, 30],
                            "tier": ["dram"] * 4 + ["flash"] * 2,
                            "dram_bytes_used": [0, 400, 490, 500, 500, 500]})
    assert an.fill_time_s(samples, "dram_bytes_used", 500, tier="dram") == 90
    # 500 B in 150 B chunks holds 3 chunks, 450 B: full from the 490 B sample on
    assert an.fill_time_s(samples, "dram_bytes_used", 500, tier="dram", chunk_bytes=150) == 60
    assert an.fill_time_s(samples, "dram_bytes_used", 500) == 0  # all tiers
    assert math.isnan(an.fill_time_s(samples, "dram_bytes_used", 1000, tier="dram"))
    with pytest.raises(ValueError, match="capacity_bytes"):
        an.fill_time_s(samples, "dram_bytes_used", tier="dram")
    # the samples' own whole-chunk capacity wins over the configured one
    with_cap = samples.assign(dram_capacity_bytes=400)
    assert an.fill_time_s(with_cap, "dram_bytes_used", 500, tier="dram") == 30


def test_fill_time_from_the_simulator_s_eviction_counters() -> None:
    # bytes reach the capacity at 60 s, but the first chunk is only evicted by 90 s; the
    # flash tier has no dram store (NaN counters), the second dram run refuses instead
    samples = pd.DataFrame({
        "time_s": [0, 30, 60, 90, 120, 0, 30, 0, 30, 60],
        "tier": ["dram"] * 5 + ["flash"] * 2 + ["keep"] * 3,
        "dram_bytes_used": [0, 400, 500, 500, 500, np.nan, np.nan, 0, 500, 500],
        "dram_capacity_bytes": [500] * 5 + [np.nan] * 2 + [500] * 3,
        "dram_evicted_chunks": [0, 0, 0, 2, 9, np.nan, np.nan, 0, 0, 0],
        "dram_rejected_chunks": [0, 0, 0, 0, 0, np.nan, np.nan, 0, 0, 4]})
    assert an.fill_time_s(samples, "dram_bytes_used", tier="dram") == 90
    assert an.fill_time_s(samples, "dram_bytes_used", 10e9, tier="dram") == 90  # not bytes
    assert an.fill_time_s(samples, "dram_bytes_used", tier="keep") == 60
    assert math.isnan(an.fill_time_s(samples, "dram_bytes_used", 500, tier="flash"))
    assert an.fill_time_s(samples, "dram_bytes_used") == 60  # the earliest of all tiers


def test_fill_time_exact_from_a_simulated_run_s_stats() -> None:
    samples = pd.DataFrame({"time_s": [0, 30], "dram_bytes_used": [0, 500],
                            "dram_evicted_chunks": [0, 3]})
    nan = math.nan
    got = an.fill_time_s(samples, "dram_bytes_used",
                         stats={"dram_first_eviction_s": 12.5, "dram_first_refusal_s": nan})
    assert got == 12.5
    assert an.fill_time_s(samples, "dram_bytes_used", stats={
        "dram_first_eviction_s": 20.0, "dram_first_refusal_s": 17.0}) == 17.0
    assert math.isnan(an.fill_time_s(samples, "dram_bytes_used", stats={
        "dram_first_eviction_s": nan, "dram_first_refusal_s": nan}))
    # stats of another store say nothing about this one: the samples' counters decide
    assert an.fill_time_s(samples, "dram_bytes_used", stats={"flash_first_eviction_s": 1}) == 30


# ---------------------------------------------------------------- study A in one call

# Per tier, one request per 60 s bin with first token == finish at the bin centre, so each
# bin's rate is (prompt + output) / 60 exactly. Bin 0 is warm-up; bins 3 and 4 are resumes.
PROMPT = {"baseline": [600] * 6, "dram": [606, 600, 2400, 1800, 900, 900],
          "flash": [600, 600, 1800, 1800, 1500, 1500]}
OUTPUT = {"baseline": [60] * 6, "dram": [60, 60, 120, 90, 60, 60],
          "flash": [60, 60, 90, 90, 90, 90]}
TTFT = {"baseline": [9, 0.4, 2.0, 1.2, 1.6, 3.0], "dram": [9, 0.5, 0.5, 0.6, 0.8, 0.7],
        "flash": [9, 0.6, 0.6, 0.7, 3.2, 0.9]}


@pytest.fixture
def three_tiers() -> tuple[pd.DataFrame, pd.DataFrame]:
    rows = []
    for tier in PROMPT:
        for i in range(6):
            t = 60 * i + 30
            rows.append(rec(tier=tier, send_s=t - TTFT[tier][i], first_token_s=t, finish_s=t,
                            prompt_tokens=PROMPT[tier][i], output_tokens=OUTPUT[tier][i],
                            is_warmup=i == 0, is_resume=i in (3, 4), session_id=i))
    samples = pd.DataFrame({"time_s": [0, 60, 120, 180, 240, 60],
                            "tier": ["dram"] * 5 + ["flash"],
                            "dram_bytes_used": [0, 100, 300, 500, 500, 500]})
    return frame(rows), samples


def test_study_a_headlines_by_hand(three_tiers) -> None:
    records, samples = three_tiers
    got = study_a_headlines(records, samples, run_s=360, early_window_s=120,
                               dram_capacity_bytes=500)
    # totals per bin (tok/s): baseline 11 everywhere; dram 11.1 11 42 31.5 16 16;
    # flash 11 11 31.5 31.5 26.5 26.5. After window = last third = bins 4, 5.
    want = {
        "A2.baseline_plateau": 11, "A2.dram_peak_gain": 42 / 11,
        "A2.flash_peak_gain": 31.5 / 11, "A2.dram_after": 16, "A2.flash_after": 26.5,
        "A2.dram_retained": 100 * 16 / 42, "A2.flash_retained": 100 * 26.5 / 31.5,
        "A2.early_spread": 100 * 0.1 / ((11 + 11.1 + 11) / 3),
        "A2.dram_fill_time": 3.0,
        # output (tok/s): baseline 1; dram 1 1 2 1.5 1 1; flash 1 1 1.5 1.5 1.5 1.5
        "A3.dram_peak_output": 2, "A3.dram_output_gain": 2, "A3.flash_output": 1.5,
        "A3.flash_output_gain": 1.5,
        # sent before 120 s, not warm-up, not resume: 0.4, 0.5, 0.6
        "A4.ttft_cached": 0.5,
        # baseline binned medians in the first half (bins 1, 2): 0.4, 2.0
        "A4.baseline_ttft_high": 2.0,
        # dram binned medians in bins ending by the fill at 180 s: 0.5, 0.5
        "A4.dram_ttft_before_fill": 0.5,
        "A5.resume_median_baseline": 1.4, "A5.resume_max_baseline": 1.6,
        "A5.resume_median_dram": 0.7, "A5.resume_max_dram": 0.8,
        "A5.resume_median_flash": 1.95, "A5.resume_max_flash": 3.2,
        # sent in the second half (>= 180 s): baseline 1.2 1.6 3.0, dram 0.6 0.8 0.7, flash
        # 0.7 3.2 0.9 -> medians 1.6, 0.7, 0.9: flash over the lowest other = 0.9 / 0.7
        "A4.flash_late_ratio": 0.9 / 0.7,
        # normal turns per tier (A5's bars): 0.4 2.0 3.0 / 0.5 0.5 0.7 / 0.6 0.6 0.9; no
        # median pooled over the tiers (it would be 0.6, matching no bar)
        "A5.resumes": 2, "A5.normal_ttft_baseline": 2.0,
        "A5.normal_ttft_dram": 0.5, "A5.normal_ttft_flash": 0.6,
    }
    assert set(got) == set(want)
    assert "A5.normal_ttft" not in got
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key
    assert set(got) <= set(load_reference().index)


def test_a5_counts_only_sessions_that_resumed_in_every_tier(three_tiers) -> None:
    records, samples = three_tiers
    # flash got further through the workload: one more, slow resume nobody else reached
    extra = frame([rec(tier="flash", send_s=340, first_token_s=390, finish_s=390,
                       is_resume=True, session_id=9)])
    both = pd.concat([records, extra], ignore_index=True)
    assert an.common_resume_sessions(both) == {3, 4}
    got = study_a_headlines(both, samples, run_s=360, dram_capacity_bytes=500)
    assert got["A5.resume_max_flash"] == pytest.approx(3.2)
    assert got["A5.resumes"] == 2
    own = study_a_headlines(both, samples, run_s=360, dram_capacity_bytes=500,
                               common_resumes=False)
    assert own["A5.resume_max_flash"] == pytest.approx(50.0)
    assert own["A5.resumes"] == 3
    stats = an.resume_stats(both, common_sessions=True).set_index("tier")
    assert stats.loc["flash", "n_resumes"] == 2
    assert stats.loc["flash", "n_normal"] == 3  # normal turns are all kept


def test_common_resume_sessions_empty_when_a_tier_has_none(three_tiers) -> None:
    records, _ = three_tiers
    no_dram_resumes = records[~((records.tier == "dram") & records.is_resume)]
    assert an.common_resume_sessions(no_dram_resumes) == set()


def test_study_a_headlines_omits_missing_tiers_and_fill(three_tiers) -> None:
    records, samples = three_tiers
    got = study_a_headlines(records[records.tier != "baseline"], samples, run_s=360)
    assert not any("baseline" in k or "gain" in k for k in got)
    assert "A2.dram_fill_time" not in got          # no capacity given
    assert got["A2.dram_after"] == pytest.approx(16)
    renamed = records.replace({"tier": {"dram": "cpu-offload"}})
    got = study_a_headlines(renamed, run_s=360, dram="cpu-offload")
    assert got["A2.dram_peak_gain"] == pytest.approx(42 / 11)
    assert study_a_headlines(records.assign(tier="other")) == {}


def test_study_a_headlines_smoothing_setting(three_tiers) -> None:
    records, _ = three_tiers
    settings = StudyASettings(run_s=360, smooth_bins=3, smooth="mean")
    got = study_a_headlines(records, settings=settings)
    # dram smoothed (mean of 3): bin 2 = (11 + 42 + 31.5) / 3 = 28.2, bin 3 =
    # (42 + 31.5 + 16) / 3 = 29.8 is the peak; the baseline is 11 everywhere.
    assert got["A2.dram_peak_gain"] == pytest.approx(((42 + 31.5 + 16) / 3) / 11)
    with pytest.raises(TypeError):
        study_a_headlines(records, no_such_setting=1)


def test_study_a_headlines_read_the_figures_bins(three_tiers) -> None:
    records, samples = three_tiers
    # 120 s bins merge the 60 s bins in pairs (one request per 60 s bin, all at a point):
    # dram totals (606+60+600+60)/120, (2400+120+1800+90)/120, (900+60+900+60)/120
    curves = study_a_rates(records, run_s=360, bin_s=120)
    dram = curves[curves.tier == "dram"]
    assert dram.total_tok_s.tolist() == pytest.approx([11.05, 36.75, 16.0])
    assert dram.output_tok_s.tolist() == pytest.approx([1.0, 1.75, 1.0])
    got = study_a_headlines(records, samples, run_s=360, bin_s=120)
    # late window [240, 360] holds the one bin centred at 300 s
    assert got["A2.dram_peak_gain"] == pytest.approx(36.75 / 11)
    assert got["A2.dram_retained"] == pytest.approx(100 * 16 / 36.75)
    assert got["A2.flash_retained"] == pytest.approx(100 * 26.5 / 31.5)
    assert got["A3.dram_output_gain"] == pytest.approx(1.75)
    # baseline sends (non-warm-up) 89.6 s (0.4 s), 148 (2.0), 208.8 (1.2), 268.4 (1.6),
    # 327 (3.0): the first half holds only the bin [0, 120), median 0.4
    assert got["A4.baseline_ttft_high"] == pytest.approx(0.4)
    assert study_a_headlines(records, samples, run_s=360)["A4.baseline_ttft_high"] == \
        pytest.approx(2.0)


def test_study_a_rates_smooth_once_as_the_headlines_do(three_tiers) -> None:
    records, _ = three_tiers
    settings = StudyASettings(run_s=360, smooth_bins=3, smooth="mean")
    dram = study_a_rates(records, settings).query("tier == 'dram'").total_tok_s
    # centred means of 11.1 11 42 31.5 16 16 with partial windows at the ends
    want = [(11.1 + 11) / 2, (11.1 + 11 + 42) / 3, (11 + 42 + 31.5) / 3,
            (42 + 31.5 + 16) / 3, (31.5 + 16 + 16) / 3, 16.0]
    assert dram.tolist() == pytest.approx(want)
    assert study_a_headlines(records, settings=settings)["A2.dram_after"] == \
        pytest.approx((want[4] + want[5]) / 2)


def test_study_a_ttft_and_resumes_leave_out_warm_up(three_tiers) -> None:
    records, _ = three_tiers
    ttft = study_a_ttft(records, run_s=360, bin_s=120)
    base = ttft[ttft.tier == "baseline"]
    assert base.n.tolist() == [1, 2, 2]  # the warm-up turn sent at 21 s is not counted
    assert base.ttft_median_s.tolist() == pytest.approx([0.4, 1.6, 2.3])
    resumes = study_a_resumes(records).set_index("tier")
    assert resumes.at["flash", "normal_ttft_median_s"] == pytest.approx(0.6)
    assert resumes.at["baseline", "n_resumes"] == 2


# ---------------------------------------------------------------- hits vs misses

def test_hit_miss_ttft_by_cached_share() -> None:
    rows = [rec(prompt_tokens=4000, cached_prompt_tokens=3900.0, send_s=0, first_token_s=0.2),
            rec(prompt_tokens=5000, cached_prompt_tokens=4500.0, send_s=0, first_token_s=0.4),
            rec(prompt_tokens=4000, cached_prompt_tokens=800.0, send_s=0, first_token_s=3.0),
            rec(prompt_tokens=6000, cached_prompt_tokens=0.0, send_s=0, first_token_s=5.0),
            rec(prompt_tokens=8000, cached_prompt_tokens=0.0, send_s=0, first_token_s=9.0),
            # neither: half cached; too short; failed; cached count unknown
            rec(prompt_tokens=4000, cached_prompt_tokens=2000.0, send_s=0, first_token_s=1.0),
            rec(prompt_tokens=1000, cached_prompt_tokens=1000.0, send_s=0, first_token_s=0.1),
            rec(prompt_tokens=4000, cached_prompt_tokens=4000.0, error="HTTP 500"),
            rec(prompt_tokens=4000, cached_prompt_tokens=math.nan, send_s=0,
                first_token_s=7.0)]
    out = an.hit_miss_ttft(frame(rows), min_prompt_tokens=3000).set_index("kind")
    assert list(out.index) == ["hit", "miss"]
    assert out.n.tolist() == [2, 3]  # 0.975 and 0.9 (boundary) / 0.2 (boundary), 0, 0
    assert out.at["hit", "median_ttft_s"] == pytest.approx(0.3)
    assert out.at["miss", "median_ttft_s"] == pytest.approx(5.0)
    assert out.at["miss", "median_prompt_tokens"] == 6000
    assert out.at["hit", "rule"] == ">= 90% cached"
    strict = an.hit_miss_ttft(frame(rows), min_prompt_tokens=3000, hit_share=0.95,
                              miss_share=0.1).set_index("kind")
    assert strict.n.tolist() == [1, 2]
    none = an.hit_miss_ttft(frame(rows), min_prompt_tokens=10_000).set_index("kind")
    assert none.n.tolist() == [0, 0] and none.median_ttft_s.isna().all()
    with pytest.raises(ValueError, match="miss_share"):
        an.hit_miss_ttft(frame(rows), hit_share=0.2, miss_share=0.5)
    with pytest.raises(ValueError, match="hit_share"):
        an.hit_miss_ttft(frame(rows), hit_share=1.5)


# ---------------------------------------------------------------- bad input

def test_missing_columns_are_named() -> None:
    df = frame([rec()]).drop(columns=["finish_s", "output_tokens"])
    with pytest.raises(ValueError, match=r"\['finish_s', 'output_tokens'\]"):
        an.throughput_over_time(df)
    with pytest.raises(ValueError, match="is_resume"):
        an.resume_stats(frame([rec()]).drop(columns="is_resume"))
    with pytest.raises(ValueError, match="time_s"):
        an.fill_time_s(pd.DataFrame({"used": [1]}), "used", 10)


@pytest.mark.parametrize("bin_s", [0, -60, math.nan])
def test_bad_bin_width_is_named(bin_s) -> None:
    with pytest.raises(ValueError, match="bin_s"):
        an.throughput_over_time(frame([rec()]), bin_s=bin_s)
    with pytest.raises(ValueError, match="bin_s"):
        an.ttft_over_time(frame([rec()]), bin_s=bin_s)


def test_other_bad_parameters() -> None:
    data = binned(CURVES)
    with pytest.raises(ValueError, match="smooth_bins"):
        an.peak(data, smooth_bins=0)
    with pytest.raises(ValueError, match="how"):
        an.plateau(data, smooth_bins=3, how="mode")
    with pytest.raises(ValueError, match="nvme"):
        an.crossover_time_s(data, "nvme", "dram")
    with pytest.raises(ValueError, match="capacity_bytes"):
        an.fill_time_s(pd.DataFrame({"time_s": [0], "u": [1]}), "u", -10)
    with pytest.raises(ValueError, match="chunk_bytes"):
        an.fill_time_s(pd.DataFrame({"time_s": [0], "u": [1]}), "u", 10, chunk_bytes=0)


def test_prompt_tokens_by_source_from_live_counters() -> None:
    samples = pd.DataFrame({
        "tier": ["flash"] * 3, "time_s": [0.0, 10.0, 20.0],
        "prompt_tokens_local_compute": [100.0, 600.0, 1100.0],
        "prompt_tokens_local_cache_hit": [0.0, 200.0, 300.0],
        "prompt_tokens_external_kv_transfer": [0.0, 400.0, 800.0],
        "lmcache_l1_hit_tokens": [0.0, 100.0, 250.0],   # LMCache's own hits: only the ratio
        "lmcache_l2_hit_tokens": [0.0, 500.0, 750.0],   # counts (250 : 750 -> 25 % / 75 %)
        "scrape_error": ["", "", ""]})
    row = an.prompt_tokens_by_source(samples).set_index("tier").loc["flash"]
    assert row.computed_tokens == 1000 and row.engine_hit_tokens == 300
    assert row.offload_hit_tokens == 800 and row.offload_l2_share == pytest.approx(0.75)
    assert (row.offload_l1_tokens, row.offload_l2_tokens) == pytest.approx((200, 600))


def test_prompt_tokens_by_source_without_lmcache_counters() -> None:
    samples = pd.DataFrame({"tier": ["sim"] * 2, "time_s": [0.0, 5.0],
                            "prompt_tokens": [0.0, 1000.0],
                            "prefix_cache_hits_tokens": [0.0, 300.0],
                            "external_prefix_cache_hits_tokens": [0.0, 200.0]})
    row = an.prompt_tokens_by_source(samples).iloc[0]
    assert (row.computed_tokens, row.engine_hit_tokens, row.offload_hit_tokens) == (500, 300, 200)
    assert math.isnan(row.offload_l2_share)


def test_prompt_sources_figure_stacks_shares() -> None:
    from kvrepro.plots.run_figures import prompt_sources

    table = pd.DataFrame({"tier": ["baseline", "dram"], "computed_tokens": [80.0, 30.0],
                          "engine_hit_tokens": [20.0, 20.0], "offload_l1_tokens": [0.0, 50.0],
                          "offload_l2_tokens": [0.0, 0.0]})
    fig = prompt_sources(table)
    widths = [p.get_width() for p in fig.axes[0].patches]
    assert widths[:2] == pytest.approx([80, 30]) and widths[4:6] == pytest.approx([0, 50])
    with pytest.raises(ValueError, match="prompt-sources"):
        prompt_sources(table.drop(columns="offload_l2_tokens"))


def test_process_cpu_reads_the_run_queue_wait_where_the_samples_have_it() -> None:
    from kvrepro.analysis.runs import process_cpu

    samples = pd.DataFrame({"time_s": [0.0, 2.0], "proc_worker_cpu_user_s": [1.0, 2.0],
                            "proc_worker_cpu_system_s": [0.0, 0.2],
                            "proc_worker_ctx_involuntary": [10.0, 30.0],
                            "proc_worker_runqueue_wait_s": [0.5, 1.5]})
    row = process_cpu(samples).iloc[0]
    assert (row.cpu_busy, row.ctx_involuntary_per_s, row.runqueue_wait_per_s) == (
        pytest.approx(0.6), 10.0, 0.5)
    assert np.isnan(row.slices_per_s) and np.isnan(row.wait_per_slice_s)
    older = process_cpu(samples.drop(columns="proc_worker_runqueue_wait_s")).iloc[0]
    assert older.cpu_busy == pytest.approx(0.6) and np.isnan(older.runqueue_wait_per_s)
    sliced = process_cpu(samples.assign(proc_worker_runqueue_slices=[100.0, 300.0])).iloc[0]
    assert (sliced.slices_per_s, sliced.wait_per_slice_s) == (100.0, pytest.approx(0.005))


def test_token_delivery_counts_the_answers_that_came_in_one_burst() -> None:
    """Of the succeeded answers with more than one token, a streamed one (5 ms between
    tokens) and one whose 11 tokens arrived together; a one-token and a failed answer do not
    count."""
    records = pd.DataFrame({
        "send_s": [0.0, 0.0, 0.0, 0.0], "first_token_s": [0.1, 0.5, 0.2, 0.3],
        "finish_s": [0.15, 0.5, 0.2, 0.9], "output_tokens": [11, 11, 1, 11],
        "error": ["", None, "", "timeout"]})
    got = runs.token_delivery(records)
    assert got["n_answers"] == 2 and got["burst_share"] == 0.5
    assert got["gap_median_s"] == pytest.approx(0.0025)
    assert runs.token_delivery(records, burst_s=0.0)["burst_share"] == 0.0
