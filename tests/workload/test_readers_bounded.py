"""Readers of traces and telemetry read lines with a bound (`max_line_bytes`): a longer line is
a clear error naming file, line and limit (strict) or one named skip (lax), the lines after it
are still read, and the long line is never held in memory whole."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest

from kvrepro._lines import line_too_long
from kvrepro.analysis.token_mix import (
    NoUsableRecordsError,
    TelemetryFormatError,
    read_claude_code,
)
from kvrepro.workload.trace_replay import read_block_trace, read_mooncake_trace

LIMIT_BYTES = 400
T0_NS = 1_772_409_600_000_000_000


def mooncake_line(t_ms: int, n_blocks: int = 2) -> str:
    return json.dumps({"timestamp": t_ms, "input_length": 512 * n_blocks, "output_length": 8,
                       "hash_ids": list(range(n_blocks))})


def write_lines(path: Path, lines: list[str]) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def otlp_line(t_s: int, session: str = "s1") -> str:
    """One compact OTLP logs line holding one api_request (as the collector writes it)."""
    attrs = [{"key": "event.name", "value": {"stringValue": "api_request"}},
             {"key": "session.id", "value": {"stringValue": session}},
             {"key": "input_tokens", "value": {"intValue": "3"}},
             {"key": "output_tokens", "value": {"intValue": "5"}},
             {"key": "cache_read_tokens", "value": {"intValue": "7"}},
             {"key": "cache_creation_tokens", "value": {"intValue": "11"}}]
    record = {"timeUnixNano": str(T0_NS + t_s * 10**9), "attributes": attrs,
              "body": {"stringValue": "claude_code.api_request"}}
    return json.dumps({"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [
        {"scope": {"name": "com.anthropic.claude_code.events"}, "logRecords": [record]}]}]},
        separators=(",", ":"))


# ------------------------------------------------------------------------- block-hash traces


@pytest.mark.parametrize("name", ["trace.jsonl", "trace.jsonl.gz"])
def test_trace_line_over_the_limit_strict_names_file_line_and_limit(tmp_path: Path,
                                                                    name: str) -> None:
    long_line = mooncake_line(1, n_blocks=200)
    assert len(long_line) > LIMIT_BYTES
    path = write_lines(tmp_path / name, [mooncake_line(0), long_line, mooncake_line(2)])
    with pytest.raises(ValueError) as caught:
        read_mooncake_trace(path, max_line_bytes=LIMIT_BYTES)
    assert str(caught.value) == line_too_long(path, 2, LIMIT_BYTES)
    assert f"{path}:2:" in str(caught.value) and "400 bytes" in str(caught.value)


def test_trace_line_over_the_limit_lax_is_one_named_skip(tmp_path: Path) -> None:
    lines = [mooncake_line(0), mooncake_line(1, n_blocks=200), mooncake_line(2),
             mooncake_line(3)]
    path = write_lines(tmp_path / "trace.jsonl", lines)
    read = read_mooncake_trace(path, strict=False, max_line_bytes=LIMIT_BYTES)
    assert read.frame.line.tolist() == [1, 3, 4]
    assert read.skipped.line.tolist() == [2]
    assert "longer than 400 bytes" in read.skipped.reason[0]
    assert "max_line_bytes" in read.skipped.reason[0]
    # the bound is the reader's: with the default limit, the same line is read
    assert read_mooncake_trace(path).frame.line.tolist() == [1, 2, 3, 4]


def test_trace_line_exactly_at_the_limit_is_read(tmp_path: Path) -> None:
    line = mooncake_line(0, n_blocks=20)
    path = write_lines(tmp_path / "trace.jsonl", [line, mooncake_line(1)])
    assert len(read_mooncake_trace(path, max_line_bytes=len(line)).frame) == 2
    with pytest.raises(ValueError, match=r":1: line longer than"):
        read_mooncake_trace(path, max_line_bytes=len(line) - 1)


def test_trace_limit_is_checked(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "trace.jsonl", [mooncake_line(0)])
    with pytest.raises(ValueError, match="max_line_bytes"):
        read_block_trace(path, "mooncake", max_line_bytes=0)


def test_trace_file_without_newline_is_not_held_whole(tmp_path: Path) -> None:
    """20 MB without a newline, then good lines: Python never holds much more than the
    limit (before, the whole line was one bytes object, then parsed)."""
    path = tmp_path / "blob.jsonl"
    with open(path, "wb") as out:
        out.write(b'{"timestamp": 0, "hash_ids": [' + b"1, " * 7_000_000)
        out.write(("\n" + mooncake_line(1) + "\n").encode())
    tracemalloc.start()
    try:
        read = read_mooncake_trace(path, strict=False, max_line_bytes=2**20)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert read.skipped.line.tolist() == [1] and read.frame.line.tolist() == [2]
    assert peak_bytes < 6 * 2**20, f"peak {peak_bytes / 2**20:.1f} MiB for a 1 MiB bound"


# ------------------------------------------------------------------------- Claude Code telemetry


def test_otlp_line_over_the_limit_strict_and_lax(tmp_path: Path) -> None:
    long_line = otlp_line(1, session="x" * 3 * LIMIT_BYTES)
    assert len(otlp_line(0)) < LIMIT_BYTES * 3 < len(long_line)
    path = write_lines(tmp_path / "export.jsonl", [otlp_line(0), long_line, otlp_line(2)])
    with pytest.raises(TelemetryFormatError) as caught:
        read_claude_code(path, strict=True, max_line_bytes=LIMIT_BYTES * 3)
    assert str(caught.value) == line_too_long(path, 2, LIMIT_BYTES * 3)
    lax = read_claude_code(path, max_line_bytes=LIMIT_BYTES * 3)
    assert len(lax.frame) == 2 and lax.frame.session_id.tolist() == ["s1", "s1"]
    assert lax.skipped[["line", "record"]].values.tolist() == [[2, ""]]
    assert "longer than 1,200 bytes" in lax.skipped.reason[0]


def test_otlp_cut_first_line_then_lines_over_the_limit_in_all(tmp_path: Path) -> None:
    """A file that starts mid-line (a cut export), longer than the limit in all: the cut
    line is one skip and every line after it is read, streamed (not one document)."""
    lines = [otlp_line(0)[40:], *(otlp_line(t) for t in range(1, 60))]
    path = write_lines(tmp_path / "cut.jsonl", lines)
    assert path.stat().st_size > 4 * 1500
    read = read_claude_code(path, max_line_bytes=1500)
    assert len(read.frame) == 59
    assert read.skipped.line.tolist() == [1]
    with pytest.raises(TelemetryFormatError, match=r"cut\.jsonl:1: "):
        read_claude_code(path, strict=True, max_line_bytes=1500)


def test_otlp_first_line_without_newline_over_the_limit(tmp_path: Path) -> None:
    """A file with no newline at all: one named skip, never read whole; nothing usable."""
    path = tmp_path / "blob.json"
    path.write_bytes(b'{"resourceLogs": [' + b"0," * 5_000_000)
    tracemalloc.start()
    try:
        with pytest.raises(NoUsableRecordsError, match=r"longer than 1,048,576 bytes"):
            read_claude_code(path, max_line_bytes=2**20)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 6 * 2**20, f"peak {peak_bytes / 2**20:.1f} MiB for a 1 MiB bound"
    with pytest.raises(TelemetryFormatError, match=r"blob\.json:1: line longer than"):
        read_claude_code(path, strict=True, max_line_bytes=2**20)


def pretty_export(n_records: int) -> str:
    """One pretty-printed OTLP document (no line of it is JSON alone)."""
    doc = json.loads(otlp_line(0))
    records = doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
    records *= n_records
    return json.dumps(doc, indent=2)


def test_otlp_pretty_document_within_the_limit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "pretty.json"
    path.write_text(pretty_export(3))
    read = read_claude_code(path, strict=True, max_line_bytes=path.stat().st_size)
    assert len(read.frame) == 3


def test_otlp_pretty_document_over_the_limit_is_an_error_naming_the_limit(
        tmp_path: Path) -> None:
    path = tmp_path / "pretty.json"
    path.write_text(pretty_export(40))
    limit = path.stat().st_size // 4
    with pytest.raises(TelemetryFormatError) as caught:
        read_claude_code(path, strict=True, max_line_bytes=limit)
    assert str(caught.value).startswith(f"{path}:1: ")
    assert f"longer than {limit:,} bytes" in str(caught.value)
    with pytest.raises(NoUsableRecordsError, match=f"longer than {limit:,} bytes"):
        read_claude_code(path, max_line_bytes=limit)


def test_loki_lines_with_one_over_the_limit(tmp_path: Path) -> None:
    def page(t_s: int, pad: int = 0) -> str:
        line = json.dumps({"body": "claude_code.api_request", "session_id": "s1",
                           "input_tokens": 1, "output_tokens": 2, "padding": "p" * pad})
        return json.dumps({"data": {"resultType": "streams", "result": [
            {"stream": {"service_name": "claude-code"},
             "values": [[str(T0_NS + t_s * 10**9), line]]}]}})
    path = write_lines(tmp_path / "loki.jsonl", [page(0), page(1, pad=2000), page(2)])
    read = read_claude_code(path, fmt="loki", max_line_bytes=1000)
    assert len(read.frame) == 2 and read.skipped.line.tolist() == [2]
    with pytest.raises(TelemetryFormatError, match=r"loki\.jsonl:2: line longer than 1,000"):
        read_claude_code(path, fmt="loki", strict=True, max_line_bytes=1000)


def test_csv_row_over_the_limit_keeps_line_numbers(tmp_path: Path) -> None:
    header = "event.name,session.id,input_tokens,output_tokens"
    rows = ["api_request,s1,1,2", f"api_request,{'x' * 500},3,4", "api_request,s1,5,6",
            "api_request,s1,7,x"]
    path = write_lines(tmp_path / "export.csv", [header, *rows])
    read = read_claude_code(path, max_line_bytes=100)
    assert read.frame.input_tokens.tolist() == [1, 5]
    assert read.skipped.line.tolist() == [3, 5]  # the long row, then the bad number, by line
    assert "longer than 100 bytes" in read.skipped.reason[0]
    with pytest.raises(TelemetryFormatError, match=r"export\.csv:3: line longer than 100"):
        read_claude_code(path, strict=True, max_line_bytes=100)


def test_csv_lines_ended_by_bare_cr_are_still_rows(tmp_path: Path) -> None:
    """Read line by line now, a CSV of old-Mac lines (CR only) still splits into its rows,
    with their line numbers, as the whole-text reader did."""
    path = tmp_path / "mac.csv"
    path.write_bytes(b"event.name,input_tokens,output_tokens\rapi_request,1,2\r"
                     b"api_request,x,2\rapi_request,3,4\r")
    read = read_claude_code(path, max_line_bytes=1000)
    assert read.frame.input_tokens.tolist() == [1, 3]
    assert read.skipped.line.tolist() == [3]


def test_telemetry_limit_is_checked(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "export.jsonl", [otlp_line(0)])
    with pytest.raises(ValueError, match="max_line_bytes"):
        read_claude_code(path, max_line_bytes=-1)


def test_azure_csv_line_without_newline_is_one_bad_row(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A line past the limit in an Azure CSV is one named bad row, not the whole file in
    memory; the rows after it are still read."""
    from kvrepro.workload import benchmarks
    from kvrepro.workload.benchmarks import read_azure_trace

    monkeypatch.setattr(benchmarks, "MAX_LINE_BYTES", 1024)
    src = tmp_path / "azure.csv"
    src.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    b"2023-11-16 18:15:46.6805900,374,44\n" + b"9" * 5000 + b"\n"
                    b"2023-11-16 18:15:50.9951690,396,109\n")
    with pytest.raises(ValueError, match=r"azure.csv:3: line longer than 1024 bytes"):
        read_azure_trace(src)
    lax = read_azure_trace(src, strict=False)
    assert len(lax.frame) == 2 and list(lax.skipped.line) == [3]
