"""Campaigns, profile overrides, study A targets, and notebook 04 with small parameters."""

from pathlib import Path

import pandas as pd
import pytest

from kvrepro import analysis
from kvrepro.engines.sim import load_profile
from kvrepro.engines.sim.campaign import simulate_campaign
from kvrepro.reproduce import reproduce
from kvrepro.studies import reference
from kvrepro.studies.study_a import check_targets, implied_baseline
from kvrepro.studies.study_a_headlines import study_a_headlines
from kvrepro.tier_spec import load_server, override_server
from kvrepro.workload import AgenticSpec, generate_agentic
from tests.conftest import NOTEBOOKS

STUDY_A = Path(__file__).resolve().parents[3] / "data" / "servers" / "study_a.yaml"


def test_shipped_profiles_load() -> None:
    for path in sorted(STUDY_A.parent.glob("*.yaml")):
        profile = load_profile(path)
        assert profile.tiers and profile.server.kv_cache_bytes > 0


def test_override_aliases_and_paths() -> None:
    base = load_server(STUDY_A)
    bigger = override_server(base, {"dram_gb": 1024, "engine.max_num_seqs": 30})
    assert bigger.tiers["dram"].stores[0].capacity_bytes == 1024e9
    assert bigger.engine.max_num_seqs == 30 != base.engine.max_num_seqs  # base not changed
    with pytest.raises(ValueError, match="nvme_gb"):
        override_server(base, {"nvme_gb": 1})
    with pytest.raises(ValueError, match="mfuu"):
        override_server(base, {"engine.mfuu": 1})
    with pytest.raises(ValueError, match="no store named 'flash'"):
        override_server(base.model_copy(update={"tiers": {"baseline": base.tiers["baseline"]}}),
                        {"flash_gb": 1})


def test_campaign_tiers_share_the_early_minutes() -> None:
    workload = generate_agentic(AgenticSpec(duration_s=900, seed=4))
    records, samples = simulate_campaign(workload, STUDY_A, progress=False)
    assert set(records.tier) == {"baseline", "dram", "flash"} == set(samples.tier)
    binned = analysis.throughput_over_time(records, 300, 900)
    first = binned[binned.bin_start_s == 0].set_index("tier").total_tok_s
    assert first.max() / first.min() < 1.02  # all tiers alike while VRAM holds everything


def test_check_targets() -> None:
    table = reference.compare({"A2.baseline_plateau": 13000, "A2.dram_retained": 55,
                               "A2.early_spread": 0.5, "A5.resumes": 9})
    met = check_targets(table).set_index("id").met
    assert met["A2.baseline_plateau"] and not met["A2.dram_retained"]
    assert met["A2.early_spread"] and pd.isna(met["A5.resumes"])


def test_implied_baseline_works_the_ratios_out() -> None:
    ref = reference.load_reference().copy()
    table = implied_baseline(ref).set_index("quantity")
    # 17,000 / 0.42 / 2.9: the study's DRAM numbers imply a baseline near 14,000 at the peak
    assert table.at["baseline total at DRAM's peak", "study"] == pytest.approx(13957, abs=1)
    assert table.at["baseline output late in the run", "study"] == pytest.approx(250 / 1.46)
    ref.loc["A2.dram_peak_gain", "value"] = 1.0  # another reference gives another answer
    assert implied_baseline(ref).set_index("quantity").at[
        "baseline total at DRAM's peak", "study"] == pytest.approx(17000 / 0.42)
    sim = {k: float(v) for k, v in ref["value"].items()}
    sim["A3.flash_output"] = 200.0
    both = implied_baseline(ref, sim).set_index("quantity")
    assert both.at["baseline output late in the run", "simulated"] == pytest.approx(200 / 1.46)


def test_study_a_notebook_numbers(tmp_path) -> None:
    params = {"duration_s": 1800.0, "bin_s": 300.0, "other_seeds": [1]}
    result = reproduce(NOTEBOOKS, tmp_path / "fig", tmp_path / "runs", ["study_a"], params)
    assert not result.failures, result.failures
    got = result.headlines.set_index("id").reproduced
    from kvrepro.calibration.calibrate import load_plan
    from kvrepro.studies.study_a import STUDY_A_PLAN

    campaign = load_plan(STUDY_A_PLAN).campaign  # the fitted workload and client cap
    fields = {**campaign["workload"], "duration_s": 1800.0, "warmup_s": 180.0}
    workload = generate_agentic(AgenticSpec(**fields))  # the plan's fitted workload
    records, samples = simulate_campaign(workload, STUDY_A, warmup_s=180.0, progress=False,
                                         max_in_flight=campaign["max_in_flight"])
    direct = study_a_headlines(records, samples, dram_capacity_bytes=512e9,
                                        run_s=1800.0, bin_s=300.0)  # the notebook's bins
    assert got["A2.baseline_plateau"] == pytest.approx(direct["A2.baseline_plateau"])
    assert got["A2.dram_peak_gain"] == pytest.approx(direct["A2.dram_peak_gain"])
    assert got["A5.normal_ttft_dram"] == pytest.approx(direct["A5.normal_ttft_dram"])
    for name in ("A2-total-throughput", "A3-output-throughput", "A4-ttft-over-time",
                 "A5-returning-users", "A2-dram-keeps-when-full"):
        assert (tmp_path / "fig" / f"{name}.png").exists()
