"""inference-perf's shared_prefix workload: Poisson stages, prompt order, block-hash sharing."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from kvrepro.engines.sim.prefix_units import BlockIdentity, block_ids
from kvrepro.workload.base import (
    SESSION_COLUMNS,
    TURN_COLUMNS,
    Workload,
    load_workload,
    save_workload,
)
from kvrepro.workload.shared_prefix import GENERATOR, SharedPrefixSpec, shared_prefix_workload

SYSTEM, QUESTION = 96, 32  # gcd 32: 3 system blocks, 1 question block


def small_spec(**changes) -> SharedPrefixSpec:
    params = {"num_groups": 4, "num_prompts_per_group": 3, "system_prompt_len": SYSTEM,
              "question_len": QUESTION, "output_len": 8,
              "stages": [{"rate_qps": 5, "duration_s": 20}, {"rate_qps": 20, "duration_s": 30}],
              "seed": 3}
    return SharedPrefixSpec(**(params | changes))


@pytest.fixture(scope="module")
def workload() -> Workload:
    return shared_prefix_workload(small_spec())


def common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


def stage_times(wl: Workload, k: int) -> np.ndarray:
    """Arrival times of stage k, relative to its recorded start."""
    t = wl.turns
    return t.not_before_s[t.stage == k].to_numpy() - wl.spec["stage_start_s"][k]


# ------------------------------------------------------------------ Poisson stages


def test_each_stage_sends_int_rate_times_duration_over_about_its_duration():
    spec = small_spec(stages=[{"rate_qps": r, "duration_s": 60} for r in (5, 10, 40)]
                      + [{"rate_qps": 2.5, "duration_s": 7.9}])
    wl = shared_prefix_workload(spec)
    for k, stage in enumerate(spec.stages):
        rel = stage_times(wl, k)
        assert len(rel) == int(stage.rate_qps * stage.duration_s)  # load_generator.py l. 771
        assert np.all(np.diff(rel) > 0) and rel[0] > 0
        # the stage lasts as many 1 s windows as its Poisson counts need: duration +- noise
        noise_s = 4 * math.sqrt(stage.duration_s / stage.rate_qps) + 1
        assert abs(rel[-1] - stage.duration_s) < noise_s


def test_counts_per_second_are_poisson_and_each_busy_second_ends_on_its_last_request():
    spec = small_spec(stages=[{"rate_qps": 20, "duration_s": 400}], seed=11)
    rel = stage_times(shared_prefix_workload(spec), 0)
    windows = np.ceil(rel - 1e-9).astype(int) - 1  # window w holds (w, w + 1]
    counts = np.bincount(windows)[:-1]  # the last window may be cut short
    assert counts.mean() == pytest.approx(20, rel=0.05)
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.25)  # Poisson: var = mean
    # ConstantLoadTimer rescales the gaps to sum to 1 s: every full window ends exactly on a
    # whole second (exponential inter-arrivals would almost never hit one)
    on_whole_second = np.isclose(rel, np.round(rel), rtol=0, atol=1e-9)
    full = np.unique(windows[windows < windows[-1]])  # all but the last, maybe cut, window
    assert on_whole_second.sum() == len(full) + on_whole_second[-1]


def test_stages_run_back_to_back_and_the_gap_shifts_them(workload):
    starts = workload.spec["stage_start_s"]
    first_end = math.ceil(stage_times(workload, 0)[-1] - 1e-9)
    assert starts == [0.0, first_end]
    second = workload.turns.not_before_s[workload.turns.stage == 1]
    assert starts[1] < second.min() <= starts[1] + 2
    assert workload.turns.not_before_s.is_monotonic_increasing
    gapped = shared_prefix_workload(small_spec(stage_gap_s=2.5))
    assert gapped.spec["stage_start_s"] == [0.0, first_end + 2.5]
    assert np.allclose(gapped.turns.not_before_s - workload.turns.not_before_s,
                       np.where(workload.turns.stage == 1, 2.5, 0.0))


def test_changing_a_later_stage_leaves_earlier_stages_alone(workload):
    other = shared_prefix_workload(small_spec(stages=[{"rate_qps": 5, "duration_s": 20},
                                                      {"rate_qps": 7, "duration_s": 9}]))
    assert np.array_equal(stage_times(other, 0), stage_times(workload, 0))
    assert not np.array_equal(stage_times(other, 1)[:5], stage_times(workload, 1)[:5])


# ------------------------------------------------------------------ prompt order


def test_each_stage_cycles_the_same_seeded_shuffle_from_its_start(workload):
    spec = small_spec()
    n_prompts = spec.num_groups * spec.num_prompts_per_group
    t = workload.turns
    flat = (t.group * spec.num_prompts_per_group + t.prompt_index).to_numpy()
    cycles = []
    for k in range(len(spec.stages)):
        seq = flat[t.stage.to_numpy() == k]
        assert sorted(seq[:n_prompts]) == list(range(n_prompts))  # each prompt once per cycle
        assert np.array_equal(seq, np.resize(seq[:n_prompts], len(seq)))  # i % len(prompts)
        cycles.append(seq[:n_prompts])
    assert np.array_equal(cycles[0], cycles[1])  # get_data() restarts at index 0 per stage
    assert not np.array_equal(cycles[0], np.arange(n_prompts))  # shuffled, not group-major
    again = shared_prefix_workload(small_spec()).turns
    assert np.array_equal(again.group, t.group) and np.array_equal(again.prompt_index,
                                                                   t.prompt_index)
    reseeded = shared_prefix_workload(small_spec(seed=4)).turns
    assert not np.array_equal(reseeded.group[:n_prompts], t.group[:n_prompts])


# ------------------------------------------------------------------ sharing


def test_hash_block_is_the_gcd_of_the_lengths():
    assert shared_prefix_workload(small_spec()).spec["tokens"]["block_size"] == 32
    big = small_spec(system_prompt_len=16000, question_len=256,
                     stages=[{"rate_qps": 1, "duration_s": 2}])
    wl = shared_prefix_workload(big)
    assert wl.spec["hash_block_tokens"] == 128
    assert len(wl.turns.hash_ids.iloc[0]) == (16000 + 256) // 128


def test_same_group_shares_exactly_the_system_hashes(workload):
    n_sys = SYSTEM // 32
    t = workload.turns
    firsts = t.drop_duplicates(["group", "prompt_index"])
    for _, a in firsts.iterrows():
        for _, b in firsts.iterrows():
            if (a.group, a.prompt_index) == (b.group, b.prompt_index):
                continue
            shared = common_prefix(a.hash_ids, b.hash_ids)
            assert shared == (n_sys if a.group == b.group else 0)
            overlap = set(a.hash_ids) & set(b.hash_ids)
            assert overlap == (set(a.hash_ids[:n_sys]) if a.group == b.group else set())


def test_same_group_and_prompt_give_identical_hashes(workload):
    for _, rows in workload.turns.groupby(["group", "prompt_index"]):
        assert len(rows) > 1 and rows.hash_ids.map(tuple).nunique() == 1


def test_tokens_and_simulator_blocks_share_exactly_the_system_prompt(workload):
    t = workload.turns
    a = t[(t.group == 1) & (t.prompt_index == 0)].index[0]
    b = t[(t.group == 1) & (t.prompt_index == 2)].index[0]
    c = t[t.group == 2].index[0]
    ids = {i: workload.prompt_ids(int(t.session_id[i]), 0) for i in (a, b, c)}
    assert all(len(v) == SYSTEM + QUESTION for v in ids.values())
    assert common_prefix(ids[a], ids[b]) == SYSTEM
    assert common_prefix(ids[a], ids[c]) == 0
    identity = BlockIdentity(workload)
    assert identity.rule == "trace"
    blocks = {i: block_ids(identity, int(i), SYSTEM + QUESTION, 16) for i in (a, b, c)}
    assert common_prefix(blocks[a], blocks[b]) == SYSTEM // 16
    assert not set(blocks[a]) & set(blocks[c])


# ------------------------------------------------------------------ spec and validity


@pytest.mark.parametrize(("change", "field"), [
    ({"stages": [{"rate_qps": -1, "duration_s": 10}]}, "rate_qps"),
    ({"stages": [{"rate_qps": 1, "duration_s": 0}]}, "duration_s"),
    ({"stages": [{"rate_qps": 1, "duration_s": 5, "rate": 2}]}, "rate"),
    ({"stages": []}, "stages"),
    ({"num_groups": 0}, "num_groups"),
    ({"system_prompt_len": -16}, "system_prompt_len"),
    ({"num_unique_system_prompts": 4}, "num_unique_system_prompts"),
])
def test_bad_spec_names_the_field(change, field):
    with pytest.raises(ValidationError) as err:
        small_spec(**change)
    assert any(field in map(str, e["loc"]) for e in err.value.errors())


def test_workload_is_valid_and_round_trips(workload, tmp_path):
    t, s = workload.turns, workload.sessions
    for table, columns in ((t, TURN_COLUMNS), (s, SESSION_COLUMNS)):
        assert {c: str(table[c].dtype) for c in columns} == columns
    assert {"stage", "group", "prompt_index", "hash_ids"} <= set(t.columns)
    assert (t.turn == 0).all() and (t.pause_s == 0).all() and (s.n_turns == 1).all()
    assert np.array_equal(t.not_before_s, s.arrival_s)
    assert (t.prompt_tokens == SYSTEM + QUESTION).all()
    assert (t.append_tokens == t.prompt_tokens).all()
    assert (t.output_tokens == 8).all()
    spec = workload.spec
    assert spec["generator"] == GENERATOR and spec["params"] == small_spec().model_dump(mode="json")
    assert spec["n_requests"] == len(t) == 5 * 20 + 20 * 30
    loaded = load_workload(save_workload(workload, tmp_path / "wl"))  # checks columns, digest
    assert loaded.digest() == workload.digest()
    assert np.array_equal(loaded.prompt_ids(7, 0), workload.prompt_ids(7, 0))
    assert pd.api.types.is_integer_dtype(loaded.turns.stage)
    assert shared_prefix_workload(small_spec()).digest() == workload.digest()


def test_llm_d_shape_builds():
    spec = SharedPrefixSpec(num_groups=250, num_prompts_per_group=5, system_prompt_len=16000,
                            question_len=256, output_len=250,
                            stages=[{"rate_qps": r, "duration_s": 60} for r in range(5, 45, 5)])
    wl = shared_prefix_workload(spec)
    assert len(wl.turns) == 60 * sum(range(5, 45, 5)) == 10_800
    assert wl.turns.groupby("stage").size().tolist() == [60 * r for r in range(5, 45, 5)]
