"""Study B's workloads: microbenchmark, multi-turn macrobenchmark and their input readers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from kvrepro.workload.base import SeededTokens, Workload, load_workload, save_workload
from kvrepro.workload.benchmarks import (
    KeyedTokens,
    MacrobenchSpec,
    MicrobenchSpec,
    azure_conversations,
    macrobenchmark,
    microbenchmark,
    read_azure_trace,
    read_sharegpt,
)

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
AZURE_CONV = SHARED_DATA / "azure" / "AzureLLMInferenceTrace_conv.csv"


@pytest.fixture(scope="module")
def azure_path() -> Path:
    if not AZURE_CONV.is_file():
        pytest.skip(f"real Azure trace not found at {AZURE_CONV} (shared data not mounted)")
    return AZURE_CONV


def assert_round_trip(workload: Workload, directory: Path, sessions: list[int]) -> Workload:
    loaded = load_workload(save_workload(workload, directory))
    assert loaded.digest() == workload.digest()
    assert type(loaded.tokens) is type(workload.tokens)
    for sid in sessions:
        last = int(workload.turns.turn[workload.turns.session_id == sid].max())
        assert np.array_equal(loaded.prompt_ids(sid, last), workload.prompt_ids(sid, last))
    return loaded


# --------------------------------------------------------------------------- microbenchmark


def test_microbench_measure_prompts_equal_fill_prompts() -> None:
    spec = MicrobenchSpec(prompt_lengths=[64, 300, 1024], prompts_per_length=3, seed=4)
    workload = microbenchmark(spec)
    turns = workload.turns
    fill, measure = turns[turns["round"] == "fill"], turns[turns["round"] == "measure"]
    assert len(fill) == len(measure) == 9
    assert fill.not_before_s.max() < measure.not_before_s.min()
    assert fill.prompt_key.tolist() == measure.prompt_key.tolist()
    prompts = {}
    for f_sid, m_sid, length in zip(fill.session_id, measure.session_id, fill.prompt_tokens,
                                    strict=True):
        a, b = workload.prompt_ids(f_sid, 0), workload.prompt_ids(m_sid, 0)
        assert len(a) == length and np.array_equal(a, b)
        prompts[f_sid] = a
    assert sorted(fill.prompt_tokens.tolist()) == [64] * 3 + [300] * 3 + [1024] * 3
    firsts = {tuple(p[:16]) for p in prompts.values()}
    assert len(firsts) == 9  # distinct prompts do not share a prefix
    assert workload.sessions.is_warmup.sum() == 9
    assert set(workload.sessions.cohort) == {"fill", "measure"}


def test_microbench_defaults_and_validation() -> None:
    workload = microbenchmark()
    lengths = workload.turns.prompt_tokens
    assert sorted(set(lengths)) == [1024, 4096, 16384, 32768]
    assert len(workload.turns) == 2 * 4 * 4 and set(workload.turns.output_tokens) == {1}
    assert np.all(np.diff(workload.turns.not_before_s) > 0)
    with pytest.raises(ValidationError, match="extra"):
        MicrobenchSpec(prompt_length=[5])
    with pytest.raises(ValidationError, match="prompt_lengths"):
        MicrobenchSpec(prompt_lengths=[1024, 0])
    with pytest.raises(ValidationError, match="gap_s"):
        MicrobenchSpec(gap_s=0)


def test_microbench_round_trip_and_determinism(tmp_path: Path) -> None:
    spec = MicrobenchSpec(prompt_lengths=[100, 2000], prompts_per_length=2, seed=9)
    workload = microbenchmark(spec)
    assert microbenchmark(spec).digest() == workload.digest()
    assert microbenchmark(spec.model_copy(update={"seed": 10})).digest() != workload.digest()
    loaded = assert_round_trip(workload, tmp_path / "micro", [0, 3, 4, 7])
    assert isinstance(loaded.tokens, KeyedTokens)
    assert np.array_equal(loaded.prompt_ids(1, 0), loaded.prompt_ids(5, 0))


# --------------------------------------------------------------------------- macrobenchmark


def assert_prompts_grow(workload: Workload, sessions: list[int]) -> None:
    """Turn k+1's prompt starts with turn k's prompt + turn k's output; lengths match."""
    turns = workload.turns
    for sid in sessions:
        rows = turns[turns.session_id == sid].sort_values("turn")
        previous = None
        for row in rows.itertuples(index=False):
            ids = workload.prompt_ids(sid, row.turn)
            assert len(ids) == row.prompt_tokens
            if previous is not None:
                assert np.array_equal(ids[:len(previous)], previous)
            previous = np.concatenate([ids, workload.tokens.output_ids(
                rows[rows.turn == row.turn].iloc[0])])
        assert len(rows) >= 1


def assert_rate_near_qps(workload: Workload, spec: MacrobenchSpec) -> None:
    """While every user is busy, the users together send qps requests per second."""
    turns = workload.turns
    all_busy_until = turns.groupby("user").not_before_s.max().min()
    sent = int((turns.not_before_s < all_busy_until).sum())
    assert sent == pytest.approx(spec.qps * all_busy_until, rel=0.02, abs=2)
    for _, times in turns.groupby("user").not_before_s:
        assert np.allclose(np.diff(np.sort(times.to_numpy())), spec.user_gap_s)
    starts = workload.sessions.groupby("user").arrival_s.min().sort_index()
    assert np.allclose(starts.to_numpy(), np.arange(spec.num_users) / spec.qps)


def test_synthetic_macrobench_schedule_and_growth(tmp_path: Path) -> None:
    spec = MacrobenchSpec(qps=0.5, num_users=6, max_conversations=60, seed=2,
                          shared_prefix_tokens=32)
    workload = macrobenchmark(spec)
    assert len(workload.sessions) == 60
    assert workload.turns.groupby("session_id").size().mean() == pytest.approx(4, rel=0.3)
    assert workload.turns.append_tokens.mean() == pytest.approx(160, rel=0.35)
    assert workload.turns.output_tokens.mean() == pytest.approx(340, rel=0.35)
    assert_rate_near_qps(workload, spec)
    multi = workload.sessions.session_id[workload.sessions.n_turns >= 3].tolist()[:3]
    assert_prompts_grow(workload, multi)
    assert isinstance(workload.tokens, SeededTokens)
    assert macrobenchmark(spec).digest() == workload.digest()
    assert macrobenchmark(spec.model_copy(update={"seed": 3})).digest() != workload.digest()
    assert_round_trip(workload, tmp_path / "synthetic", multi)


def test_context_cap_ends_conversations() -> None:
    spec = MacrobenchSpec(max_conversations=40, context_cap_tokens=1500, seed=1)
    workload = macrobenchmark(spec)
    turns = workload.turns
    assert (turns.prompt_tokens + turns.output_tokens).max() <= 1500
    assert (workload.sessions.end_reason == "cap").any()
    dropped = workload.spec["source"]["conversations_over_cap_dropped"]
    assert dropped > 0 and len(workload.sessions) == 40 - dropped
    assert workload.sessions.n_turns.min() >= 1


def test_macrobench_spec_validation() -> None:
    with pytest.raises(ValidationError, match="path"):
        MacrobenchSpec(source="sharegpt")
    with pytest.raises(ValidationError, match="qps"):
        MacrobenchSpec(qps=0)
    with pytest.raises(ValidationError, match="extra"):
        MacrobenchSpec(users=3)


def test_azure_macrobench(azure_path: Path, tmp_path: Path) -> None:
    spec = MacrobenchSpec(source="azure", path=str(azure_path), qps=0.2, num_users=5,
                          max_conversations=50, seed=8, context_cap_tokens=10**6)
    workload = macrobenchmark(spec)
    rows = read_azure_trace(azure_path).frame
    turns = workload.turns
    assert len(rows) == 19_366 and workload.spec["source"]["skipped"] == 0
    # Conversations are consecutive trace rows: appends and outputs replay the rows in order.
    assert turns.sort_values(["session_id", "turn"]).append_tokens.tolist() == \
        rows.context_tokens[:len(turns)].tolist()
    assert turns.sort_values(["session_id", "turn"]).output_tokens.tolist() == \
        rows.generated_tokens[:len(turns)].tolist()
    assert workload.sessions.n_turns.mean() == pytest.approx(4, rel=0.35)
    assert_rate_near_qps(workload, spec)
    multi = workload.sessions.session_id[workload.sessions.n_turns >= 3].tolist()[:3]
    assert_prompts_grow(workload, multi)
    assert_round_trip(workload, tmp_path / "azure", multi)


def test_azure_grouping_covers_rows_in_order(azure_path: Path) -> None:
    read = read_azure_trace(azure_path)
    conv = azure_conversations(read, mean_turns=4.0, seed=0, max_conversations=100_000)
    assert len(conv) == len(read.frame)
    assert conv.groupby("conversation").size().mean() == pytest.approx(4, rel=0.1)
    assert (conv.groupby("conversation").turn.min() == 0).all()


# --------------------------------------------------------------------------- ShareGPT


SHAREGPT = [
    {"id": "a1", "conversations": [
        {"from": "system", "value": "s" * 40}, {"from": "human", "value": "h" * 100},
        {"from": "gpt", "value": "g" * 401}, {"from": "human", "value": "q" * 8},
        {"from": "gpt", "value": "r" * 20}, {"from": "gpt", "value": "t" * 4},
        {"from": "human", "value": "x" * 30}, {"from": "gpt", "value": "y" * 50},
        {"from": "human", "value": "no answer"}]},
    {"id": "b2", "conversations": [
        {"from": "gpt", "value": "hello" * 2}, {"from": "human", "value": "u" * 12},
        {"from": "gpt", "value": "v" * 3}]},
    {"id": "c3", "conversations": [
        {"from": "human", "value": "w" * 400}, {"from": "gpt", "value": "z" * 800}]},
]


def test_sharegpt_conversion(tmp_path: Path) -> None:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT, indent=1))
    frame = read_sharegpt(path).frame
    a1 = frame[frame.source_id == "a1"]
    assert a1[["append_tokens", "output_tokens"]].values.tolist() == [
        [math.ceil(140 * 0.25), math.ceil(401 * 0.25)], [2, 5 + 1], [8, 13]]
    b2 = frame[frame.source_id == "b2"]
    assert b2[["append_tokens", "output_tokens"]].values.tolist() == [[6, 1]]
    spec = MacrobenchSpec(source="sharegpt", path=str(path), qps=0.4, num_users=2, seed=1)
    workload = macrobenchmark(spec)
    assert workload.sessions.source_id.tolist() == ["a1", "b2", "c3"]
    assert workload.turns.prompt_tokens[workload.turns.session_id == 0].tolist() == [
        35, 35 + 101 + 2, 35 + 101 + 2 + 6 + 8]
    assert workload.turns.not_before_s.tolist() == pytest.approx([0, 5, 10, 2.5, 7.5])
    assert_prompts_grow(workload, [0, 1, 2])
    assert_round_trip(workload, tmp_path / "sharegpt_wl", [0, 1, 2])


def test_bad_sharegpt_entry_names_file_entry_and_id(tmp_path: Path) -> None:
    entries = [SHAREGPT[0], {"id": "broken", "conversation": []}, SHAREGPT[2]]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(entries, indent=1))
    with pytest.raises(ValueError, match=r"bad\.json:\d+: entry 1 \(id 'broken'\): missing "
                                         r"field 'conversations'"):
        read_sharegpt(path)
    read = read_sharegpt(path, strict=False)
    assert read.n_skipped == 1
    assert read.frame.source_id.unique().tolist() == ["a1", "c3"]
    line = int(read.skipped.line[0])  # where the entry starts: its id follows right after
    assert '"broken"' in "\n".join(path.read_text().splitlines()[line - 1:line + 2])


def test_truncated_sharegpt_keeps_complete_entries(tmp_path: Path) -> None:
    text = json.dumps(SHAREGPT, indent=1)
    path = tmp_path / "cut.json"
    path.write_text(text[:text.index('"c3"') + 30])
    with pytest.raises(ValueError, match=r"cut\.json:\d+: entry 2: malformed JSON"):
        read_sharegpt(path)
    read = read_sharegpt(path, strict=False)
    assert read.n_skipped == 1
    assert read.frame.source_id.unique().tolist() == ["a1", "b2"]
    (tmp_path / "obj.json").write_text('{"id": 1}')
    with pytest.raises(ValueError, match=r"obj\.json:1: expected a JSON array"):
        read_sharegpt(tmp_path / "obj.json")


# --------------------------------------------------------------------------- Azure errors


AZURE_ROWS = [
    "TIMESTAMP,ContextTokens,GeneratedTokens",
    "2023-11-16 18:15:46.6805900,374,44",
    "2023-11-16 18:15:50.9951690,396,109",
    "2023-11-16 18:15:51.2224670,lots,55",
    "2023-11-16 18:15:51.3910170,91,16,7",
    "2023-11-16 18:15:52.5732450,91",
    "2023-11-16 18:15:52.9921190,381,84",
]


def test_bad_azure_rows_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text("\n".join(AZURE_ROWS) + "\n")
    with pytest.raises(ValueError, match=r"azure\.csv:4: ContextTokens must be an integer"):
        read_azure_trace(path)
    read = read_azure_trace(path, strict=False)
    assert read.skipped.line.tolist() == [4, 5, 6]
    assert "too many fields" in read.skipped.reason[1]
    assert "GeneratedTokens" in read.skipped.reason[2]
    assert read.frame.line.tolist() == [2, 3, 7]
    assert read.frame.context_tokens.tolist() == [374, 396, 381]
    assert read.frame.arrival_s.iloc[1] == pytest.approx(4.314579)
    (tmp_path / "cols.csv").write_text("time,ctx,gen\n1,2,3\n")
    with pytest.raises(ValueError, match=r"cols\.csv:1: missing column"):
        read_azure_trace(tmp_path / "cols.csv")


def test_a_stamp_with_a_utc_offset_among_naive_ones_is_read(tmp_path: Path) -> None:
    # found by tests/workload/test_fuzz_readers.py: pandas raised "Mixed timezones detected"
    # (no file, no line) for the whole file; the offset stamp is one instant, naive stamps
    # count as UTC
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.5-01,300,40\n2023-11-16 19:15:47.5,317,41\n")
    read = read_azure_trace(path)
    assert read.frame.arrival_s.tolist() == pytest.approx([0.0, 1.0])
