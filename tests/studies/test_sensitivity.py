"""Notebook 04's sensitivities (kvrepro.studies.sensitivity) on short study-A campaigns.

Each sweep is checked against what it claims to change, measured on its own runs (requests in
flight, evictions, the flag's effect), and against the same variant simulated directly.
"""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvrepro import analysis
from kvrepro.engines.sim import sim_profile
from kvrepro.engines.sim.campaign import simulate_campaign
from kvrepro.studies import sensitivity as sens
from kvrepro.studies.study_a import STUDY_A_PAUSE, targets_met, without_queue_wait
from kvrepro.studies.study_a_headlines import StudyASettings, study_a_headlines, study_a_resumes
from kvrepro.tier_spec import load_server, override_server
from kvrepro.workload import AgenticSpec, generate_agentic

STUDY_A = Path(__file__).resolve().parents[2] / "data" / "servers" / "study_a.yaml"
DURATION_S, WARMUP_S = 1500.0, 120.0
TIERS = ["baseline", "dram", "flash"]


def make_workload(seed: int):
    return generate_agentic(AgenticSpec(seed=seed, duration_s=DURATION_S, warmup_s=WARMUP_S,
                                        pause=STUDY_A_PAUSE, session_rate_per_min=4.0))


@pytest.fixture(scope="module")
def spec():
    # a small DRAM tier, so that it fills within the short run; synchronous loads (LMCache's
    # default; the shipped spec has the load mode its calibration chose), so that the load
    # mode sweep's other run is the asynchronous one
    return override_server(load_server(STUDY_A), {
        "dram_gb": 48, "tiers.dram.lmcache.enable_async_loading": False,
        "tiers.flash.lmcache.enable_async_loading": False})


@pytest.fixture(scope="module")
def settings():
    return StudyASettings(bin_s=300.0, run_s=DURATION_S, dram_capacity_bytes=48e9)


@pytest.fixture(scope="module")
def base(spec):
    return simulate_campaign(make_workload(0), spec, TIERS, warmup_s=WARMUP_S, progress=False)


def max_in_flight(records: pd.DataFrame, spec) -> int:
    """Most requests of one tier in the server at any moment: from send to the engine's
    finish (the recorded finish less the API server's front-end time, which the twin adds
    to the times it records), by a sweep over events (a finish before a send at one time)."""
    server = sim_profile(spec).server
    front_end_s = (server.front_end_latency_s
                   + server.front_end_per_token_s * records.prompt_tokens)
    records = records.assign(engine_finish_s=records.finish_s - front_end_s)
    most = 0
    for _, part in records.groupby("tier"):
        times = np.concatenate([part.send_s, part.engine_finish_s])
        steps = np.concatenate([np.ones(len(part)), -np.ones(len(part))])
        order = np.lexsort((steps, times))
        most = max(most, int(np.cumsum(steps[order]).max()))
    return most


def test_swap_tiers_replaces_only_the_variant_tiers() -> None:
    base = (pd.DataFrame({"tier": ["a", "b", "b"], "x": [1, 2, 3]}),
            pd.DataFrame({"tier": ["a", "b"], "y": [10, 20]}))
    variant = (pd.DataFrame({"tier": ["b"], "x": [9]}), pd.DataFrame({"tier": ["b"], "y": [90]}))
    records, samples = sens.swap_tiers(base, variant)
    assert records.x.tolist() == [1, 9] and samples.y.tolist() == [10, 90]
    with pytest.raises(ValueError, match="'tier'"):
        sens.swap_tiers(base, (pd.DataFrame({"x": [1]}), variant[1]))


def test_in_flight_sweep_caps_requests_and_matches_a_direct_run(spec, settings, base) -> None:
    sweep = sens.in_flight_sweep(make_workload(0), spec, base, [4], settings, WARMUP_S)
    assert list(dict.fromkeys(sweep.table.max_in_flight)) == ["none", "4"]
    limited = sweep.runs["4"][0]
    assert max_in_flight(limited, spec) <= 4 < max_in_flight(base[0], spec)
    direct = simulate_campaign(make_workload(0), spec, TIERS, warmup_s=WARMUP_S,
                               progress=False, max_in_flight=4)
    want = study_a_headlines(*direct, settings)
    got = sens.reproduced_by(sweep)
    for ref_id, value in want.items():
        assert got.at[ref_id, "4"] == pytest.approx(value), ref_id
    unlimited = study_a_headlines(*base, settings)
    assert got["none"].dropna().to_dict() == pytest.approx(unlimited)
    with pytest.raises(ValueError, match="limits"):
        sens.in_flight_sweep(make_workload(0), spec, base, [0], settings)


def test_store_policy_sweep_keeps_what_the_store_holds(spec, settings, base) -> None:
    sweep = sens.store_policy_sweep(make_workload(0), spec, base, settings, WARMUP_S)
    keep_records, keep_samples = sweep.runs["keeps when full"]
    assert set(keep_records.tier) == {"dram"}
    lru = base[1][base[1].tier == "dram"]
    assert lru.dram_evicted_chunks.max() > 0            # the LRU store turned over
    assert keep_samples.dram_evicted_chunks.max() == 0  # the other one never evicts ...
    assert keep_samples.dram_rejected_chunks.max() > 0  # ... and refuses once full
    got = sens.reproduced_by(sweep, ["A2.dram_after"])
    assert list(got.index) == ["A2.dram_after"]
    assert got.at["A2.dram_after", "keeps when full"] != got.at["A2.dram_after", "LRU"]
    with pytest.raises(ValueError, match="'tier'"):
        sens.store_policy_sweep(make_workload(0), spec, base, settings, tier="nvme")


def test_seed_sweep_and_its_views(spec, settings, base) -> None:
    sweep = sens.seed_sweep(make_workload, spec, base, 0, [1], settings, WARMUP_S)
    assert list(dict.fromkeys(sweep.table.seed)) == [0, 1]
    other = simulate_campaign(make_workload(1), spec, TIERS, warmup_s=WARMUP_S, progress=False)
    want = study_a_headlines(*other, settings)
    got = sens.reproduced_by(sweep, figures=["A5"])[1].dropna()  # NaN: seed 0 only
    assert set(got.index) == {i for i in want if i.startswith("A5.")}
    assert got.to_dict() == pytest.approx({i: want[i] for i in got.index})
    counts = sens.met_by(sweep)
    for seed in (0, 1):
        part = sweep.table[sweep.table.seed == seed]
        predicted = part[(part.kind == "predicted") & part.met.notna()]
        assert counts.at[seed, "predicted"] == len(predicted)
        assert counts.at[seed, "predicted_met"] == int(predicted.met.astype(bool).sum())
        assert counts.loc[seed].to_dict() == targets_met(part)
    matrix = sens.met_matrix(sweep)
    judged = sweep.table[sweep.table.met.notna()]
    assert set(matrix.index) == set(judged.id)
    for ref_id, row in matrix.iterrows():
        n = int(judged[judged.id == ref_id].met.astype(bool).sum())
        assert row["met in"] == f"{n} of 2"
    with pytest.raises(ValueError, match="seeds"):
        sens.seed_sweep(make_workload, spec, base, 0, [0], settings)
    with pytest.raises(ValueError, match="ids"):
        sens.reproduced_by(sweep, ["A9.nothing"])


def test_without_queue_wait_takes_out_the_admission_wait(base) -> None:
    records = pd.DataFrame({"send_s": [0.0, 10.0], "first_token_s": [5.0, 10.5],
                            "queue_s": [3.0, 0.0], "ttft_s": [5.0, 0.5]})
    out = without_queue_wait(records)
    assert out.first_token_s.tolist() == [2.0, 10.5]
    assert out.ttft_s.tolist() == [2.0, 0.5]
    assert records.first_token_s.tolist() == [5.0, 10.5]  # the input is left alone
    with pytest.raises(ValueError, match="queue_s"):
        without_queue_wait(records.drop(columns="queue_s"))
    # on a simulated run: each resume's TTFT less its own queue wait, tier by tier
    sim = base[0]
    fast = study_a_resumes(without_queue_wait(sim)).set_index("tier")
    resumes = sim[sim.is_resume & ~sim.is_warmup & (sim.error == "")
                  & sim.session_id.isin(analysis.common_resume_sessions(sim[~sim.is_warmup]))]
    for tier, part in resumes.groupby("tier"):
        want = (part.first_token_s - part.queue_s - part.send_s).median()
        assert fast.at[tier, "resume_ttft_median_s"] == pytest.approx(want), tier
