"""Study B on the simulator: the profile, B6's tier ordering and hit origin, B7's small gap,
the headline definitions, the figures, and notebook 05 against the package."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from kvrepro._paths import data_file
from kvrepro.calc import economics
from kvrepro.engines.sim import load_profile
from kvrepro.engines.sim.config import sim_profile
from kvrepro.plots import study_b_figures as bfigs
from kvrepro.reproduce import reproduce
from kvrepro.studies import study_b as studyb
from kvrepro.workload.benchmarks import MicrobenchSpec
from tests.conftest import NOTEBOOKS

SMALL_MICRO = {"prompt_lengths": [1024, 4096], "prompts_per_length": 2}
SMALL_MACRO = {"qps_values": [0.1, 0.5], "measure_rounds": 3}


@pytest.fixture(scope="module")
def b6_records() -> pd.DataFrame:
    return studyb.b6_records()


@pytest.fixture(scope="module")
def b6(b6_records: pd.DataFrame) -> pd.DataFrame:
    return studyb.b6_summary(b6_records)


@pytest.fixture(scope="module")
def b7() -> pd.DataFrame:
    return studyb.run_b7(**SMALL_MACRO)


def _norm(b6: pd.DataFrame) -> pd.DataFrame:
    return b6.pivot(index="prompt_tokens", columns="tier", values="norm_ttft")


def test_profile_loads_with_equal_capacity() -> None:
    profile = load_profile(data_file("servers", "study_b.yaml"))
    assert tuple(profile.tiers) == studyb.B6_TIERS
    assert profile.server.model_spec().kv_bytes_per_token == 163_840
    stores = {name: tier.stores[0] for name, tier in profile.tiers.items()}
    assert all(len(tier.stores) == 1 for tier in profile.tiers.values())
    assert all(store.name == name for name, store in stores.items())
    assert len({store.capacity_bytes for store in stores.values()}) == 1
    assert stores["opt"].chunk_tokens > stores["ssd1"].chunk_tokens == 256
    resized = studyb.with_cache_capacity(profile, 42.0)
    assert {t.stores[0].capacity_bytes for t in resized.tiers.values()} == {42e9}


def test_what_ifs_go_through_the_server_spec() -> None:
    """On the spec, study B's what-ifs are `override_server`'s: the spec a deployment or the
    cost model reads carries them, and the twin renders the same profile as the edit of a
    rendered profile gives."""
    spec = studyb.study_b_spec()
    resized = studyb.with_cache_capacity(spec, 42.0)
    assert economics.tier_hardware(resized.tier("mem")).dram_bytes == 42e9
    assert sim_profile(resized) == studyb.with_cache_capacity(studyb.study_b_profile(), 42.0)
    micro = studyb.microbench_profile(spec, MicrobenchSpec(**SMALL_MICRO))
    assert micro.engine.kv_cache_bytes < spec.engine.kv_cache_bytes
    assert sim_profile(micro) == studyb.microbench_profile(studyb.study_b_profile(),
                                                           MicrobenchSpec(**SMALL_MICRO))


def test_mem_ratio_is_one(b6: pd.DataFrame) -> None:
    assert (b6[b6.tier == "mem"].norm_ttft == 1.0).all()


def test_ssd_ratios_fall_as_drives_are_added(b6: pd.DataFrame) -> None:
    norm = _norm(b6)
    for length, row in norm.iterrows():
        ratios = [row[f"ssd{n}"] for n in (1, 2, 3, 4)]
        assert ratios == sorted(ratios, reverse=True), length
        assert len(set(ratios)) == 4 and ratios[-1] > 1.0
        assert 1.0 < row["opt"] < row["ssd4"] < row["ssd1"]


def test_fitted_points_near_study(b6: pd.DataFrame) -> None:
    at_32k = _norm(b6).loc[32768]
    assert at_32k["ssd1"] == pytest.approx(1.92, abs=0.03)
    assert at_32k["ssd4"] == pytest.approx(1.26, abs=0.03)
    opt = b6[b6.tier == "opt"].norm_ttft
    assert 1.03 < opt.min() and opt.max() < 1.18


def test_measure_round_hits_come_from_offload(b6_records: pd.DataFrame) -> None:
    assert set(b6_records["round"]) == {"measure"}
    assert (b6_records.gpu_hit_tokens == 0).all()
    for tier, part in b6_records.groupby("tier"):
        loaded = part[f"loaded_tokens_{tier}"]
        assert (loaded == part.prompt_tokens - 1).all(), tier  # last token always computed
        assert (part.recomputed_tokens == 1).all(), tier


def test_gpu_serving_the_measure_round_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="not fully served by the offload tier"):
        studyb.b6_records(spec=MicrobenchSpec(**SMALL_MICRO), tiers=["mem"],
                          gpu_kv_tokens=200_000)
    with pytest.raises(ValueError, match="gpu_kv_tokens"):
        studyb.b6_records(tiers=["mem"], gpu_kv_tokens=1024)


def test_b7_opt_close_to_memory(b7: pd.DataFrame) -> None:
    diff = studyb.b7_differences(b7)
    assert list(diff.qps) == SMALL_MACRO["qps_values"]
    assert (diff.diff_pct.abs() < 10).all()
    assert (b7.n_failed == 0).all() and (b7.n_requests > 0).all()
    assert (b7.offload_hit_frac > 0.3).all()  # the tier is exercised, not just the GPU
    fast, slow = b7[b7.qps == 0.1], b7[b7.qps == 0.5]
    assert slow.throughput_ktok_s.min() > 3 * fast.throughput_ktok_s.max()


def test_headline_definitions(b6: pd.DataFrame, b7: pd.DataFrame) -> None:
    got = studyb.study_b_headlines(b6, b7)
    assert set(got) == {"B6.untuned_low", "B6.untuned_high", "B6.opt_low", "B6.opt_high",
                        "B7.qps_0.1", "B7.qps_0.5"}
    at_32k = _norm(b6).loc[32768]
    assert got["B6.untuned_low"] == at_32k["ssd4"]
    assert got["B6.untuned_high"] == at_32k["ssd1"]
    diff = studyb.b7_differences(b7).set_index("qps").diff_pct
    assert got["B7.qps_0.5"] == diff[0.5]


def test_figures(b6: pd.DataFrame, b7: pd.DataFrame) -> None:
    fig = bfigs.b6_microbenchmark(b6)
    assert isinstance(fig, plt.Figure) and fig.axes[0].get_title().startswith("B6")
    fig = bfigs.b7_macrobenchmark(b7)
    assert fig.axes[0].get_title().startswith("B7")
    with pytest.raises(ValueError, match="B7"):
        bfigs.b7_macrobenchmark(b7.drop(columns="throughput_ktok_s"))


def test_notebook_matches_package(tmp_path) -> None:
    params = {**SMALL_MICRO, **SMALL_MACRO}
    result = reproduce(NOTEBOOKS, tmp_path / "fig", tmp_path / "runs", ["study_b"], params)
    assert not result.failures, result.failures
    got = result.headlines.set_index("id").reproduced
    micro = MicrobenchSpec(**SMALL_MICRO, gap_s=studyb.B6_GAP_S)
    expected = studyb.study_b_headlines(studyb.run_b6(spec=micro), studyb.run_b7(**SMALL_MACRO))
    assert set(got.index) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key
    figures = {p.name for p in (tmp_path / "fig").iterdir()}
    assert {"B6-microbenchmark.png", "B7-macrobenchmark.png"} <= figures
