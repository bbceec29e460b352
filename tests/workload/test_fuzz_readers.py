"""Bad bytes are bad input, not crashes: every file reader, fed corrupted copies of a small
valid input (bytes replaced, inserted, deleted, the file cut short, bytes that are not UTF-8),
returns a result, skips the bad line, or raises the package's own error naming the file. Any
other exception (UnicodeDecodeError, AttributeError, KeyError, TypeError, ...) fails.

In lax mode a line that is not UTF-8 is one malformed line: skipped, counted with its line
number, and every other line is kept.
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvrepro.analysis import token_mix
from kvrepro.analysis.token_mix import (
    NoUsableRecordsError,
    TelemetryFormatError,
    read_claude_code,
)
from kvrepro.records import RunWriter, read_run
from kvrepro.storage.parse import parse_fio_json
from kvrepro.workload.benchmarks import read_azure_trace, read_sharegpt
from kvrepro.workload.trace_replay import read_mooncake_trace, read_qwen_bailian_trace

ROOT = Path(__file__).resolve().parents[2]
OTLP_SAMPLE = ROOT / "data" / "samples" / "claude_code_otlp_sample.jsonl.gz"
QWEN_SAMPLE = ROOT / "data" / "samples" / "qwen_bailian_sample.jsonl"
FIO_REPORT = ROOT / "tests" / "data" / "fio" / "two_jobs.json"
MOONCAKE = ROOT.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"

FUZZ = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
NOT_UTF8 = [b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc0", b"\xc1", b"\xf5", b"\xe2\x82",
            b"\xff\xfe\x80"]
"""Byte strings that are never valid UTF-8 next to ASCII (the samples are ASCII)."""
JSON_NOISE = [b"{", b"}", b"[", b"]", b'"', b",", b":", b"\\", b"\n", b"\r", b" ", b"0", b"9",
              b"-", b".", b"e", b"E", b"\x00", b"\\u", b"null", b"true", b"1e999"]
"""ASCII that changes JSON structure or numbers rather than only the text of a string."""
WORK = Path(tempfile.mkdtemp(prefix="kvrepro-fuzz-"))
"""One folder for every example's files (hypothesis runs examples in one test call, so
pytest's per-test tmp_path cannot give each example its own)."""


# ----------------------------------------------------------------------------- samples


def _lines(data: bytes, n: int) -> bytes:
    return b"".join(data.splitlines(keepends=True)[:n])


def otlp_sample() -> bytes:
    """Four api_request log lines of the shipped (synthetic, real-format) export and one
    hand-written cumulative token.usage metric line."""
    def attr(key: str, kind: str, value: Any) -> dict:
        return {"key": key, "value": {kind: value}}
    points = [{"attributes": [attr("type", "stringValue", kind),
                              attr("session.id", "stringValue", "s1")],
               "startTimeUnixNano": "1772409600000000000",
               "timeUnixNano": str(1772409600000000000 + k * 10**9), "asInt": str(100 * k)}
              for k, kind in ((1, "input"), (2, "cacheRead"))]
    metric = {"resourceMetrics": [{"resource": {"attributes": [
        attr("service.name", "stringValue", "claude-code")]}, "scopeMetrics": [{"metrics": [
            {"name": "claude_code.token.usage", "unit": "tokens", "sum": {
                "aggregationTemporality": 2, "isMonotonic": True, "dataPoints": points}}]}]}]}
    logs = _lines(gzip.decompress(OTLP_SAMPLE.read_bytes()), 4)
    return logs + json.dumps(metric, separators=(",", ":")).encode() + b"\n"


def mooncake_sample() -> bytes:
    """Six lines of the real Mooncake conversation trace when shared data is mounted, else six
    lines in its format (512-token blocks, one hash id per started block)."""
    if MOONCAKE.is_file():
        with MOONCAKE.open("rb") as handle:
            return b"".join(next(handle) for _ in range(6))
    rows = [{"timestamp": 1000 * i, "input_length": 600 + 700 * i, "output_length": 20 + i,
             "hash_ids": list(range(10 * i, 10 * i + -(-(600 + 700 * i) // 512)))}
            for i in range(6)]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def records_sample() -> bytes:
    """records.jsonl of a five-request run, as `RunWriter` writes it (NaN included)."""
    folder = WORK / "sample_run"
    with RunWriter(folder, {"tier": "dram"}, overwrite=True) as writer:
        for i in range(5):
            writer.write_record({
                "session_id": i, "turn": i % 2, "tier": "dram", "engine": "sim",
                "send_s": 1.5 * i, "first_token_s": 1.5 * i + 0.25, "finish_s": 1.5 * i + 1,
                "prompt_tokens": 1000 + i, "output_tokens": 50,
                "cached_prompt_tokens": float("nan") if i == 2 else 800.0})
    return (folder / "records.jsonl").read_bytes()


def sharegpt_sample() -> bytes:
    """A ShareGPT JSON array of three conversations, one entry per line."""
    entries = [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": "question " * (i + 1)},
        {"from": "gpt", "value": "answer " * (3 * i + 2)}]} for i in range(3)]
    return ("[\n" + ",\n".join(json.dumps(e) for e in entries) + "\n]\n").encode()


def azure_sample() -> bytes:
    """An Azure LLM inference trace CSV of six requests."""
    rows = [f"2023-11-16 18:15:{46 + i:02d}.6805900,{300 + 17 * i},{40 + i}" for i in range(6)]
    return ("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n").encode()


OTLP, MOONCAKE_LINES, QWEN_LINES, RECORDS = (
    otlp_sample(), mooncake_sample(), _lines(QWEN_SAMPLE.read_bytes(), 8), records_sample())
FIO, SHAREGPT, AZURE = FIO_REPORT.read_bytes(), sharegpt_sample(), azure_sample()


# ----------------------------------------------------------------------------- corruption


@st.composite
def corrupted(draw: st.DrawFn, sample: bytes) -> bytes:
    """`sample` after 1-3 edits: a chunk replaced or inserted (bytes that are not UTF-8, JSON
    punctuation, or random bytes), bytes deleted, or the rest cut off."""
    data = bytearray(sample)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(("replace", "insert", "delete", "truncate")))
        pos = draw(st.integers(0, len(data)))
        chunk = draw(st.sampled_from(NOT_UTF8 + JSON_NOISE) | st.binary(min_size=1, max_size=4))
        if kind == "replace":
            data[pos:pos + len(chunk)] = chunk
        elif kind == "insert":
            data[pos:pos] = chunk
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 16))]
        else:
            del data[pos:]
    return bytes(data)


@st.composite
def one_line_not_utf8(draw: st.DrawFn, sample: bytes) -> tuple[int, bytes]:
    """(0-based index of the line, `sample` with bytes that are not UTF-8 put into it)."""
    lines = sample.splitlines(keepends=True)
    index = draw(st.integers(0, len(lines) - 1))
    line = lines[index]
    pos = draw(st.integers(0, len(line.rstrip(b"\n"))))
    lines[index] = line[:pos] + draw(st.sampled_from(NOT_UTF8)) + line[pos:]
    return index, b"".join(lines)


def only_named(call: Callable[[], Any], named: tuple[type[Exception], ...],
               path: Path, line: bool = True) -> Any:
    """`call()`'s result, or None when it raised one of `named` (exactly, not a subclass such
    as JSONDecodeError) whose message starts with `path` and, if `line`, ":<line>: ". Any
    other exception propagates and fails the test."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # truncated last line of a run
            warnings.simplefilter("ignore", pd.errors.ParserWarning)  # a CSV's bad header
            return call()
    except named as err:
        assert type(err) in named, f"{type(err).__name__} is not the reader's error: {err}"
        where = re.escape(str(path)) + (r":\d+: " if line else r"[:]")
        assert re.match(where, str(err)), f"error does not name {path} (and line): {err}"
        return None


def _write(name: str, data: bytes) -> Path:
    path = WORK / name
    path.write_bytes(data)
    return path


# ----------------------------------------------------------------------------- any corruption


@FUZZ
@given(data=corrupted(OTLP), strict=st.booleans())
def test_claude_code_otlp_reader_on_corrupted_exports(data: bytes, strict: bool) -> None:
    path = _write("claude.jsonl", data)
    try:
        result = read_claude_code(path, strict=strict)
    except NoUsableRecordsError as err:  # a whole-file verdict: names the file only
        assert str(err).startswith(f"{path}: "), err
        return
    except TelemetryFormatError as err:
        assert re.match(rf"{re.escape(str(path))}:\d+: ", str(err)), err
        return
    if strict:
        assert result.skipped.empty
    assert set(result.skipped.file) <= {str(path)}


def _read_otlp(path: Path, strict: bool) -> Any:
    """The reader's whole result, or the message of the package's error it raised."""
    try:
        return read_claude_code(path, strict=strict, signal="both")
    except (NoUsableRecordsError, TelemetryFormatError) as err:
        return f"{type(err).__name__}: {err}"


@FUZZ
@given(data=corrupted(OTLP), strict=st.booleans())
@example(data=b"\r\x00", strict=False)  # a bare CR inside a line's last two characters
def test_claude_code_fast_path_reads_like_the_general_path(data: bytes, strict: bool) -> None:
    """The msgspec path takes a line only when it reads it as the general path (regex +
    json) does: with and without it, any corrupted export gives the same frame, skips,
    ignored counts, or the same error."""
    path = _write("claude.jsonl", data)
    fast = _read_otlp(path, strict)
    with mock.patch.object(token_mix, "_msgspec_logs", return_value=None):
        general = _read_otlp(path, strict)
    if isinstance(fast, str) or isinstance(general, str):
        assert fast == general
        return
    pd.testing.assert_frame_equal(fast.frame, general.frame)
    pd.testing.assert_frame_equal(fast.skipped, general.skipped)
    assert fast.ignored == general.ignored


@FUZZ
@given(data=corrupted(MOONCAKE_LINES), strict=st.booleans())
def test_mooncake_reader_on_corrupted_traces(data: bytes, strict: bool) -> None:
    path = _write("mooncake.jsonl", data)
    result = only_named(lambda: read_mooncake_trace(path, strict=strict), (ValueError,), path)
    if result is not None:
        assert len(result.frame) + result.n_skipped <= data.count(b"\n") + 1


@FUZZ
@given(data=corrupted(QWEN_LINES), strict=st.booleans())
def test_qwen_bailian_reader_on_corrupted_traces(data: bytes, strict: bool) -> None:
    path = _write("qwen.jsonl", data)
    only_named(lambda: read_qwen_bailian_trace(path, strict=strict), (ValueError,), path)


@FUZZ
@given(data=corrupted(FIO))
def test_fio_parser_on_corrupted_reports(data: bytes) -> None:
    path = _write("fio.json", data)
    table = only_named(lambda: parse_fio_json(path), (ValueError,), path, line=False)
    if table is not None:
        assert {"jobname", "io_bytes", "bw_bytes_s"} <= set(table.columns) or table.empty


def _run_folder(records: bytes) -> Path:
    folder = WORK / "run"
    folder.mkdir(exist_ok=True)
    (folder / "records.jsonl").write_bytes(records)
    (folder / "meta.json").write_text(json.dumps({"tier": "dram", "status": "finished"}))
    (folder / "samples.jsonl").write_text('{"time_s": 0.5, "kv_usage": 0.25}\n')
    return folder


@FUZZ
@given(data=corrupted(RECORDS), strict=st.booleans())
def test_read_run_on_corrupted_records(data: bytes, strict: bool) -> None:
    folder = _run_folder(data)
    run = only_named(lambda: read_run(folder, strict=strict), (ValueError,),
                     folder / "records.jsonl")
    if run is not None:
        assert len(run.records) <= 5 and run.records.session_id.is_unique


@FUZZ
@given(data=corrupted(SHAREGPT), strict=st.booleans())
def test_sharegpt_reader_on_corrupted_files(data: bytes, strict: bool) -> None:
    path = _write("sharegpt.json", data)
    only_named(lambda: read_sharegpt(path, strict=strict), (ValueError,), path)


@FUZZ
@given(data=corrupted(AZURE), strict=st.booleans())
def test_azure_reader_on_corrupted_traces(data: bytes, strict: bool) -> None:
    path = _write("azure.csv", data)
    only_named(lambda: read_azure_trace(path, strict=strict), (ValueError,), path)


# ----------------------------------------------------------------------------- lax: one bad line


@FUZZ
@given(case=one_line_not_utf8(OTLP))
def test_lax_claude_code_reader_skips_one_undecodable_line(case: tuple[int, bytes]) -> None:
    index, data = case
    clean = read_claude_code(_write("clean.jsonl", OTLP), signal="both")
    result = read_claude_code(_write("claude.jsonl", data), signal="both")
    [(line, reason)] = result.skipped[["line", "reason"]].itertuples(index=False)
    assert line == index + 1 and reason.startswith("not UTF-8 text (byte 0x")
    kept = clean.frame.drop(index) if index < 4 else clean.frame.iloc[:4]  # line 5: metrics
    assert result.frame.reset_index(drop=True).equals(kept.reset_index(drop=True))


@FUZZ
@given(case=one_line_not_utf8(MOONCAKE_LINES))
def test_lax_trace_reader_skips_one_undecodable_line(case: tuple[int, bytes]) -> None:
    index, data = case
    result = read_mooncake_trace(_write("mooncake.jsonl", data), strict=False)
    assert result.skipped.line.tolist() == [index + 1]
    assert result.skipped.reason.iloc[0].startswith("not UTF-8 text (byte 0x")
    assert result.frame.line.tolist() == [n for n in range(1, 7) if n != index + 1]


@FUZZ
@given(case=one_line_not_utf8(RECORDS))
def test_lax_read_run_skips_one_undecodable_line(case: tuple[int, bytes]) -> None:
    index, data = case
    run = read_run(_run_folder(data), strict=False)
    [problem] = run.problems
    assert re.match(rf"{re.escape(str(WORK / 'run' / 'records.jsonl'))}:{index + 1}: "
                    r"malformed line \(not UTF-8 text", problem)
    assert run.records.session_id.tolist() == [i for i in range(5) if i != index]


@FUZZ
@given(entry=st.integers(0, 2), offset=st.integers(0, 8), bad=st.sampled_from(NOT_UTF8))
def test_lax_sharegpt_reader_skips_the_entry_with_undecodable_text(entry: int, offset: int,
                                                                   bad: bytes) -> None:
    lines = SHAREGPT.splitlines(keepends=True)
    start = lines[entry + 1].index(b'"value": "') + len(b'"value": "') + offset
    lines[entry + 1] = lines[entry + 1][:start] + bad + lines[entry + 1][start:]
    result = read_sharegpt(_write("sharegpt.json", b"".join(lines)), strict=False)
    assert result.skipped.line.tolist() == [entry + 2]
    assert "not UTF-8" in result.skipped.reason.iloc[0]
    assert sorted(set(result.frame.source_id)) == [f"c{i}" for i in range(3) if i != entry]


@FUZZ
@given(case=one_line_not_utf8(AZURE))
def test_lax_azure_reader_skips_one_undecodable_row(case: tuple[int, bytes]) -> None:
    index, data = case
    path = _write("azure.csv", data)
    if index == 0:  # the header: no columns to read
        with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:1: missing column"):
            read_azure_trace(path, strict=False)
        return
    result = read_azure_trace(path, strict=False)
    assert result.skipped.line.tolist() == [index + 1]
    assert result.skipped.reason.iloc[0].startswith("not UTF-8 text (byte 0x")
    assert result.frame.line.tolist() == [n for n in range(2, 8) if n != index + 1]


def test_samples_are_valid() -> None:
    """The fuzzed samples themselves read cleanly (so a skip above comes from the edit)."""
    assert len(read_claude_code(_write("clean.jsonl", OTLP), strict=True, signal="both").frame
               ) == 6
    assert len(read_mooncake_trace(_write("m.jsonl", MOONCAKE_LINES)).frame) == 6
    assert len(read_qwen_bailian_trace(_write("q.jsonl", QWEN_LINES)).frame) == 8
    assert len(parse_fio_json(_write("f.json", FIO))) == 2
    assert len(read_run(_run_folder(RECORDS)).records) == 5
    assert read_sharegpt(_write("s.json", SHAREGPT)).frame.source_id.nunique() == 3
    assert len(read_azure_trace(_write("a.csv", AZURE)).frame) == 6


@pytest.fixture(scope="module", autouse=True)
def _clean_work() -> Any:
    yield
    for path in sorted(WORK.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    WORK.rmdir()
