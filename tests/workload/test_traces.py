"""Block-hash trace replay: readers, their errors, BlockHashTokens, and the workload."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvrepro.workload.base import TOKEN_SOURCES, Workload, load_workload, save_workload
from kvrepro.workload.trace_replay import (
    BlockHashTokens,
    read_block_trace,
    read_mooncake_trace,
    read_qwen_bailian_trace,
    trace_to_workload,
)

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT.parent / "shared" / "data"
MOONCAKE = SHARED_DATA / "mooncake" / "conversation_trace.jsonl"
QWEN_SAMPLE = ROOT / "data" / "samples" / "qwen_bailian_sample.jsonl"
BLOCK = 512


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two id arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


@pytest.fixture(scope="module")
def mooncake_path() -> Path:
    if not MOONCAKE.is_file():
        pytest.skip(f"real Mooncake trace not found at {MOONCAKE} (shared data not mounted)")
    return MOONCAKE


@pytest.fixture(scope="module")
def mooncake_workload(mooncake_path: Path) -> Workload:
    return trace_to_workload(read_mooncake_trace(mooncake_path), seed=7)


def _sharing_pairs(hash_ids: pd.Series, modulus: int, wanted: int = 8) -> list[tuple]:
    """Real pairs (j, i, k) of requests sharing exactly k >= 1 leading blocks, both longer than
    k, whose (k+1)-th hash ids differ modulo `modulus` (so their first tokens differ).

    Mooncake hash ids are prefix hashes (an id always sits at the same block position), so a
    request shares the most blocks with the last request holding its deepest seen id.
    """
    pairs, seen_k, last = [], set(), {}
    for i, ids in enumerate(hash_ids):
        hits = [p for p, h in enumerate(ids) if (p, h) in last]
        if hits:
            j = last[(hits[-1], ids[hits[-1]])]
            a, b = np.asarray(hash_ids[j]), np.asarray(ids)
            k = common_prefix(a, b)
            if 1 <= k < min(len(a), len(b)) and k not in seen_k and (a[k] - b[k]) % modulus:
                pairs.append((j, i, k))
                seen_k.add(k)
        last.update(((p, h), i) for p, h in enumerate(ids))
        if len(pairs) == wanted:
            break
    return pairs


def test_mooncake_counts_match_file(mooncake_path: Path, mooncake_workload) -> None:
    lines = mooncake_path.read_text().splitlines()
    total_input = sum(json.loads(line)["input_length"] for line in lines)
    assert len(lines) == 12_031
    turns = mooncake_workload.turns
    assert len(turns) == len(mooncake_workload.sessions) == 12_031
    assert int(turns.prompt_tokens.sum()) == total_input
    assert int(turns.append_tokens.sum()) == total_input
    assert turns.not_before_s.is_monotonic_increasing
    assert turns.not_before_s.iloc[-1] == pytest.approx(json.loads(lines[-1])["timestamp"] / 1e3)


def test_mooncake_shared_blocks_give_exact_shared_prefix(mooncake_path: Path,
                                                         mooncake_workload) -> None:
    turns = mooncake_workload.turns
    input_length = read_mooncake_trace(mooncake_path).frame.input_length
    pairs = _sharing_pairs(turns.hash_ids, 32_000 - 16)
    assert len(pairs) >= 5
    for i, j, k in pairs:
        a, b = mooncake_workload.prompt_ids(i, 0), mooncake_workload.prompt_ids(j, 0)
        assert common_prefix(a, b) == k * BLOCK, (i, j, k)
        assert (len(a), len(b)) == (input_length[i], input_length[j])


def test_mooncake_prompt_lengths(mooncake_workload) -> None:
    turns = mooncake_workload.turns
    aligned = turns.index[turns.prompt_tokens % BLOCK == 0][:3].tolist()
    assert aligned, "the real trace has block-aligned requests (22 of them)"
    for sid in [*range(0, 12_031, 997), *aligned]:
        ids = mooncake_workload.prompt_ids(sid, 0)
        assert len(ids) == turns.prompt_tokens.iloc[sid]
        assert len(ids) == len(turns.hash_ids.iloc[sid]) * BLOCK - (-len(ids) % BLOCK)
        assert ids.dtype == np.int64 and ids.min() >= 16 and ids.max() < 32_000


def test_block_tokens_are_pure_and_seeded() -> None:
    a, b = BlockHashTokens(seed=1, block_size=16), BlockHashTokens(seed=1, block_size=16)
    other = BlockHashTokens(seed=2, block_size=16)
    p = a.prompt_from_hashes([5, 6, 7], 40)
    assert len(p) == 40
    assert np.array_equal(p, b.prompt_from_hashes([5, 6, 7], 40))
    assert np.array_equal(p[:32], a.prompt_from_hashes([5, 6, 9], 48)[:32])
    assert p[0] == 16 + 5 and p[16] == 16 + 6
    assert not np.array_equal(p[1:16], other.prompt_from_hashes([5], 16)[1:])
    # Congruent hash ids share the first token: the documented exception.
    assert a.prompt_from_hashes([3], 1)[0] == a.prompt_from_hashes([3 + 31_984], 1)[0]
    with pytest.raises(ValueError, match="does not fit"):
        a.prompt_from_hashes([1, 2], 40)
    assert TOKEN_SOURCES["block_hash"] is BlockHashTokens


def _write(path: Path, records: list, broken: dict[int, str] | None = None) -> Path:
    lines = [json.dumps(r) for r in records]
    for index, text in (broken or {}).items():
        lines[index] = text
    path.write_text("\n".join(lines) + "\n")
    return path


RECORDS = [{"timestamp": 1000 * i, "input_length": 600 + i, "output_length": 5,
            "hash_ids": [0, 10 + i]} for i in range(5)]


def test_truncated_line_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "trace.jsonl", RECORDS, {2: json.dumps(RECORDS[2])[:30]})
    with pytest.raises(ValueError, match=r"trace\.jsonl:3: malformed JSON"):
        read_mooncake_trace(path)
    read = read_mooncake_trace(path, strict=False)
    assert read.n_skipped == 1
    assert read.skipped.line.tolist() == [3]
    assert read.frame.line.tolist() == [1, 2, 4, 5]
    assert read.frame.input_length.tolist() == [600, 601, 603, 604]
    assert read.frame.arrival_s.tolist() == [0.0, 1.0, 3.0, 4.0]


def test_line_that_is_not_utf8_is_one_bad_line(tmp_path: Path) -> None:
    """A text-mode file decodes in 8 KiB chunks: one bad byte used to end the whole file
    (with strict=False every line was lost, the error named line 1). Plain and gzip."""
    plain = _write(tmp_path / "trace.jsonl", RECORDS)
    data = plain.read_bytes().split(b"\n")
    data[2] = data[2].replace(b'"output_length"', b'"output\xff_length"')
    column = data[2].index(b"\xff") + 1
    plain.write_bytes(b"\n".join(data))
    packed = tmp_path / "trace.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, packed):
        with pytest.raises(ValueError, match=rf"^{path}:3: not UTF-8 text \(byte 0xff at "
                                             rf"column {column}: invalid start byte\)"):
            read_mooncake_trace(path)
        read = read_mooncake_trace(path, strict=False)
        assert read.skipped.line.tolist() == [3]
        assert read.skipped.reason[0].startswith(f"not UTF-8 text (byte 0xff at column {column}")
        assert read.frame.line.tolist() == [1, 2, 4, 5]


def test_missing_field_and_bad_values_are_named(tmp_path: Path) -> None:
    records = [dict(r) for r in RECORDS]
    del records[1]["hash_ids"]
    records[3]["input_length"] = "600"
    records[4]["hash_ids"] = [0, 1, 2]
    path = _write(tmp_path / "t.jsonl", records)
    with pytest.raises(ValueError, match=r"t\.jsonl:2: missing field 'hash_ids'"):
        read_mooncake_trace(path)
    read = read_mooncake_trace(path, strict=False)
    assert read.skipped.line.tolist() == [2, 4, 5]
    assert "input_length" in read.skipped.reason[1]
    assert "needs 2 blocks of 512 tokens but hash_ids has 3" in read.skipped.reason[2]
    assert len(read.frame) == 2


def test_gzip_reads_like_plain(tmp_path: Path) -> None:
    plain = _write(tmp_path / "t.jsonl", RECORDS)
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    pd.testing.assert_frame_equal(read_mooncake_trace(packed).frame,
                                  read_mooncake_trace(plain).frame)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed.read_bytes()[:-12])
    with pytest.raises(ValueError, match=r"cut\.jsonl\.gz:\d+: "):
        read_mooncake_trace(cut)


def test_qwen_sample_shares_prefixes_along_chats() -> None:
    read = read_qwen_bailian_trace(QWEN_SAMPLE)
    frame = read.frame
    assert read.n_skipped == 0 and len(frame) == 30
    assert {"chat_id", "parent_chat_id", "trace_turn", "request_type"} <= set(frame.columns)
    assert frame.arrival_s.is_monotonic_increasing
    workload = trace_to_workload(read, seed=3)
    by_chat = frame.set_index("chat_id")
    children = frame[frame.parent_chat_id >= 0]
    assert len(children) >= 15
    for sid, child in children.iterrows():
        parent = by_chat.loc[child.parent_chat_id]
        full = parent.input_length // 16
        assert child.hash_ids[:full] == parent.hash_ids[:full]
        assert child.trace_turn == parent.trace_turn + 1
        psid = int(np.flatnonzero(frame.chat_id == child.parent_chat_id)[0])
        shared = common_prefix(workload.prompt_ids(sid, 0), workload.prompt_ids(psid, 0))
        assert shared >= full * 16
        assert shared < (full + 1) * 16 + 2  # the parent's partial last block was re-hashed


def test_trace_workload_round_trip(tmp_path: Path) -> None:
    workload = trace_to_workload(read_block_trace(QWEN_SAMPLE, "qwen_bailian"), seed=11,
                                 time_scale=0.5, max_requests=20)
    assert len(workload.turns) == 20
    assert workload.spec["tokens"] == {"kind": "block_hash", "seed": 11, "block_size": 16,
                                       "vocab_size": 32_000, "first_id": 16}
    assert workload.spec["trace"]["format"] == "qwen_bailian"
    assert workload.turns.not_before_s.iloc[1] == pytest.approx(3.1 * 0.5)
    loaded = load_workload(save_workload(workload, tmp_path / "wl"))
    assert loaded.digest() == workload.digest()
    assert isinstance(loaded.tokens, BlockHashTokens)
    assert loaded.turns.hash_ids.tolist() == workload.turns.hash_ids.tolist()
    for sid in (0, 7, 19):
        assert np.array_equal(loaded.prompt_ids(sid, 0), workload.prompt_ids(sid, 0))


def test_mooncake_round_trip_and_determinism(mooncake_path: Path, tmp_path: Path) -> None:
    read = read_mooncake_trace(mooncake_path)
    workload = trace_to_workload(read, seed=5, max_requests=300)
    again = trace_to_workload(read_mooncake_trace(mooncake_path), seed=5, max_requests=300)
    assert again.digest() == workload.digest()
    assert trace_to_workload(read, seed=6, max_requests=300).digest() != workload.digest()
    loaded = load_workload(save_workload(workload, tmp_path / "mc"))
    assert loaded.spec["trace"]["path"] == str(mooncake_path)
    for sid in (0, 150, 299):
        assert np.array_equal(loaded.prompt_ids(sid, 0), workload.prompt_ids(sid, 0))
    assert len(loaded.tokens.output_ids(loaded.turns.iloc[3])) == loaded.turns.output_tokens[3]
