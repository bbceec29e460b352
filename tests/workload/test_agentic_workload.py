"""Statistical and structural tests of study A's agentic workload generator."""

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from kvrepro.workload import (
    AgenticSpec,
    generate_agentic,
    load_workload,
    resumes_in_window,
    save_workload,
)

# Digest of the default workload (seed 0). It pins the generator across machines and library
# versions: a change here means every earlier run's workload differs from a new one.
DEFAULT_DIGEST = "9ee7f2d0a857e28f6e75b0422aeaab9750756b70d512bd8138fc6c3fb5fdbccd"
SEEDS = range(12)


@pytest.fixture(scope="module")
def default():
    return generate_agentic()


@pytest.fixture(scope="module")
def many():
    return [generate_agentic(AgenticSpec(seed=s)) for s in SEEDS]


def test_default_digest_is_pinned(default) -> None:
    assert default.digest() == DEFAULT_DIGEST
    assert generate_agentic(AgenticSpec(seed=0)).digest() == DEFAULT_DIGEST


def test_different_seeds_differ(many) -> None:
    assert len({w.digest() for w in many}) == len(many)


def test_arrival_rate_within_confidence_interval(default, many) -> None:
    expected = 2.5 * 90  # sessions in 90 minutes
    # Poisson count: 99.9 % interval is about +-3.29 sd for a single run.
    assert abs(len(default.sessions) - expected) < 3.29 * np.sqrt(expected)
    total = sum(len(w.sessions) for w in many)
    pooled_rate = total / (90 * len(many))
    assert abs(pooled_rate - 2.5) < 3.29 * np.sqrt(2.5 / (90 * len(many)))
    gaps = np.concatenate([np.diff(w.sessions.arrival_s) for w in many])
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.1)  # exponential gaps


def test_sizes_and_mixture_shares(many) -> None:
    turns = np.concatenate([w.turns.to_records() for w in many])
    appends, kinds = turns["append_tokens"], turns["append_kind"]
    assert appends[kinds == "tool"].min() >= 150 and appends[kinds == "tool"].max() <= 700
    assert appends[kinds == "file"].min() >= 1400 and appends[kinds == "file"].max() <= 3600
    outputs, okinds = turns["output_tokens"], turns["output_kind"]
    assert outputs[okinds == "short"].min() >= 20 and outputs[okinds == "short"].max() <= 300
    assert outputs[okinds == "code"].min() >= 300 and outputs[okinds == "code"].max() <= 1000
    # A session ends on the first draw that would pass the cap, and big (file, code) draws
    # end sessions more often, so shares are taken over turns whose inclusion could not depend
    # on their own kind: the context before them left room for the largest possible turn.
    before = turns["prompt_tokens"] - appends
    free = before <= 65_536 - 3600 - 1000
    n = free.sum()
    for flags, p in ((kinds[free] == "file", 0.1), (okinds[free] == "code", 0.1)):
        assert abs(flags.mean() - p) < 3.29 * np.sqrt(p * (1 - p) / n)
    assert np.mean(appends[kinds == "tool"]) == pytest.approx(425, abs=5)


def test_contexts_grow_monotonically_to_the_cap(default) -> None:
    t = default.turns
    assert (t.prompt_tokens + t.output_tokens).max() <= 65_536
    for _, s in t.groupby("session_id"):
        assert np.all(np.diff(s.prompt_tokens.to_numpy()) > 0)
    assert set(default.sessions.end_reason) <= {"cap", "window"}
    assert (default.sessions.end_reason == "cap").mean() > 0.9


def test_resumes_near_eleven(default, many) -> None:
    assert 5 <= len(resumes_in_window(default)) <= 18
    mean = np.mean([len(resumes_in_window(w)) for w in many])
    assert 8 <= mean <= 14
    resumes = default.turns[default.turns.is_resume]
    assert resumes.pause_s.between(840, 960).all()
    assert resumes.turn.between(18, 22).all()
    returning = set(default.sessions[default.sessions.cohort == "returning"].session_id)
    assert returning == set(resumes.session_id)


def test_prompts_share_the_previous_turn_as_prefix(default) -> None:
    t = default.turns
    session = int(t.session_id.iloc[0])
    rows = t[t.session_id == session]
    prev = default.prompt_ids(session, 0)
    out0 = default.tokens.output_ids(rows.iloc[0])
    nxt = default.prompt_ids(session, 1)
    assert len(prev) == rows.prompt_tokens.iloc[0] and len(nxt) == rows.prompt_tokens.iloc[1]
    assert np.array_equal(nxt[: len(prev) + len(out0)], np.concatenate([prev, out0]))
    other = default.prompt_ids(session + 1, 0)
    assert not np.array_equal(other[:16], prev[:16])  # no sharing across sessions
    assert prev.min() >= 16 and prev.max() < 32_000


def test_real_outputs_replace_nominal_ones(default) -> None:
    real = [np.array([7, 8, 9])]
    ids = default.prompt_ids(0, 1, outputs=real)
    first = default.prompt_ids(0, 0)
    assert np.array_equal(ids[len(first): len(first) + 3], real[0])


def test_compaction_mode() -> None:
    spec = AgenticSpec(at_cap="compact", duration_s=1800, context_cap_tokens=16_384)
    w = generate_agentic(spec)
    compacted = w.turns[w.turns.append_kind == "summary"]
    assert len(compacted) > 0
    assert (compacted.prompt_tokens == 4096).all()
    row = compacted.iloc[0]
    assert len(w.prompt_ids(int(row.session_id), int(row.turn))) == 4096
    assert (w.turns.prompt_tokens + w.turns.output_tokens).max() <= 16_384


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValidationError, match="tool_tokens"):
        AgenticSpec(tool_tokens=(600, 250))
    with pytest.raises(ValidationError, match="session_rate_per_min"):
        AgenticSpec(session_rate_per_min=-1)
    with pytest.raises(ValidationError, match="sesion_rate"):
        AgenticSpec(sesion_rate=2.0)


def test_save_load_round_trip(tmp_path) -> None:
    w = generate_agentic(AgenticSpec(duration_s=600, seed=3))
    save_workload(w, tmp_path)
    back = load_workload(tmp_path)
    assert back.digest() == w.digest()
    assert np.array_equal(back.prompt_ids(2, 3), w.prompt_ids(2, 3))
    turns = back.turns.iloc[:-5]
    turns.to_parquet(tmp_path / "turns.parquet", index=False)
    with pytest.raises(ValueError, match="digest"):
        load_workload(tmp_path)


def test_prompt_ids_from_the_session_index_match_a_scan_of_the_table() -> None:
    """prompt_ids reads one session's rows from an index built once (not a scan of the whole
    table per call); the prompts must be what a scan gives: earlier appends and outputs in
    turn order, then this turn's append."""
    from kvrepro.workload import build_workload

    wl = build_workload("agentic", {"seed": 4, "duration_s": 300, "session_rate_per_min": 20,
                                    "context_cap_tokens": 6000})
    shuffled = wl.turns.sample(frac=1.0, random_state=0)  # row order must not matter
    wl.turns = shuffled
    for row in shuffled.head(60).itertuples():
        mine = shuffled[(shuffled.session_id == row.session_id) & (shuffled.turn <= row.turn)]
        mine = mine.sort_values("turn")
        if "context_start_turn" in mine:
            mine = mine[mine.turn >= int(mine.context_start_turn.iloc[-1])]
        parts = []
        for r in mine.itertuples(index=False):
            series = pd.Series(r._asdict())
            parts.append(wl.tokens.append_ids(series))
            if r.turn < row.turn:
                parts.append(wl.tokens.output_ids(series))
        assert wl.prompt_ids(row.session_id, row.turn).tolist() == np.concatenate(parts).tolist()
    built = wl._by_session
    wl.prompt_ids(int(shuffled.session_id.iloc[0]), int(shuffled.turn.iloc[0]))
    assert wl._by_session is built  # one index for every call
