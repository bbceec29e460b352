"""Claude Code telemetry: the reader on hand-written exports, the token mix, the synthetic
generator's cache rules."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from kvrepro.analysis.token_mix import (
    FRAME_DTYPES,
    NoUsableRecordsError,
    TelemetryFormatError,
    _msgspec_logs,
    _reduce_attribute_lists,
    mix_shares,
    read_claude_code,
    token_mix,
)
from kvrepro.plots.token_mix_figures import a1_token_mix, tokenmix_sweep
from kvrepro.studies import synthetic_claude_code as synth

ROOT = Path(__file__).resolve().parents[2]
T0_NS = 1_772_409_600_000_000_000  # 2026-03-02 00:00:00 UTC


def attr(key: str, value: object, kind: str | None = None) -> dict:
    """An OTLP attribute; ints as strings unless `kind` says otherwise (proto3 JSON)."""
    if kind is None:
        kind = "intValue" if isinstance(value, int) else "stringValue"
        value = str(value) if kind == "intValue" else value
    return {"key": key, "value": {kind: value}}


def tokens(i: int, o: int, r: int, c: int) -> list[dict]:
    return [attr("input_tokens", i), attr("output_tokens", o), attr("cache_read_tokens", r),
            attr("cache_creation_tokens", c)]


def logs_line(records: list[dict], resource: list[dict] | None = None) -> str:
    return json.dumps({"resourceLogs": [{
        "resource": {"attributes": resource or [attr("service.name", "claude-code")]},
        "scopeLogs": [{"scope": {"name": "com.anthropic.claude_code.events"},
                       "logRecords": records}]}]}, separators=(",", ":"))


def api_request(session: str, t_s: float, counts: tuple[int, int, int, int],
                body: bool = True, extra: list[dict] | None = None) -> dict:
    rec = {"timeUnixNano": str(T0_NS + int(t_s * 1e9)), "severityText": "INFO",
           "attributes": [attr("session.id", session), attr("event.name", "api_request"),
                          attr("model", "claude-opus-4-8"), *tokens(*counts), *(extra or [])],
           "droppedAttributesCount": 0}
    if body:
        rec["body"] = {"stringValue": "claude_code.api_request"}
    return rec


@pytest.fixture
def otlp_logs(tmp_path: Path) -> Path:
    """Six usable api_requests in the variations real exports show, one other event, and
    four broken records."""
    lines = [
        logs_line([api_request("s1", 0, (3, 100, 0, 20_000)),
                   api_request("s1", 10, (5, 50, 20_000, 1_000), body=False),
                   {"timeUnixNano": str(T0_NS + 11 * 10**9),
                    "body": {"stringValue": "claude_code.tool_result"},
                    "attributes": [attr("tool_name", "Bash"),
                                   attr("success", True, "boolValue")]}]),
        # numbers as JSON numbers, a double, no body, time only in event.timestamp:
        logs_line([{"timeUnixNano": "0", "attributes": [
            attr("event.name", "claude_code.api_request"),
            attr("event.timestamp", "2026-03-02T00:00:20.500Z"),
            attr("session.id", "s1"), attr("input_tokens", 2, "intValue"),
            attr("output_tokens", 40.0, "doubleValue"),
            attr("cache_read_tokens", 21_000, "intValue"),
            attr("cache_creation_tokens", "600")]}]),
        # session.id on the resource, an array attribute (not the fast path), no model,
        # no cache_creation_tokens, spaces after separators:
        json.dumps(json.loads(logs_line(
            [{"timeUnixNano": str(T0_NS + 30 * 10**9), "body": {"stringValue":
                                                                "claude_code.api_request"},
              "attributes": [attr("input_tokens", 1), attr("output_tokens", 7),
                             attr("cache_read_tokens", 500),
                             {"key": "paths", "value": {"arrayValue": {"values": [
                                 {"stringValue": "/a"}]}}}]}],
            resource=[attr("service.name", "claude-code"), attr("session.id", "s2")]))),
        '{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"body": ',  # truncated line
        logs_line([api_request("s3", 40, (1, 2, 3, 4)),
                   {"body": {"stringValue": "claude_code.api_request"},
                    "attributes": [attr("input_tokens", "abc")]},
                   {"body": {"stringValue": "claude_code.api_request"},
                    "attributes": [attr("output_tokens", -5)]},
                   {"body": {"stringValue": "claude_code.api_request"},
                    "attributes": [attr("model", "m")]}]),
        json.dumps({"unexpected": True}),
    ]
    path = tmp_path / "logs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_otlp_logs_variations(otlp_logs: Path) -> None:
    result = read_claude_code(otlp_logs)
    frame = result.frame
    assert dict(frame.dtypes.astype(str)) == FRAME_DTYPES
    assert frame[["input_tokens", "output_tokens", "cache_read_tokens",
                  "cache_creation_tokens"]].values.tolist() == [
        [3, 100, 0, 20_000], [5, 50, 20_000, 1_000], [2, 40, 21_000, 600], [1, 7, 500, 0],
        [1, 2, 3, 4]]
    assert frame.session_id.tolist() == ["s1", "s1", "s1", "s2", "s3"]
    assert frame.model.tolist()[3] is None
    assert frame.timestamp_s.tolist() == pytest.approx(
        [T0_NS / 1e9 + t for t in (0, 10, 20.5, 30, 40)])
    assert set(frame.source) == {"otlp-logs"}
    assert result.ignored == {"claude_code.tool_result": 1}


def test_otlp_logs_skips_are_counted_with_file_and_line(otlp_logs: Path) -> None:
    skipped = read_claude_code(otlp_logs).skipped
    assert list(skipped.columns) == ["file", "line", "record", "reason"]
    assert set(skipped.file) == {str(otlp_logs)}
    rows = {(r.line, r.record): r.reason for r in skipped.itertuples()}
    assert rows[(4, "")].startswith("invalid JSON")
    assert rows[(5, "resourceLogs[0].scopeLogs[0].logRecords[1]")] == \
        "input_tokens is not an integer: 'abc'"
    assert rows[(5, "resourceLogs[0].scopeLogs[0].logRecords[2]")] == \
        "output_tokens is negative: -5"
    assert rows[(5, "resourceLogs[0].scopeLogs[0].logRecords[3]")] == \
        "api_request without any token count"
    assert "not an OTLP export" in rows[(6, "")]
    assert len(skipped) == 5


def test_strict_raises_at_the_first_bad_record(otlp_logs: Path) -> None:
    with pytest.raises(TelemetryFormatError, match=rf"{otlp_logs}:4: invalid JSON"):
        read_claude_code(otlp_logs, strict=True)


def test_no_usable_record_names_the_file(tmp_path: Path) -> None:
    only_tools = tmp_path / "tools.jsonl"
    only_tools.write_text(logs_line([{"body": {"stringValue": "claude_code.tool_result"},
                                      "attributes": [attr("tool_name", "Read")]}]) + "\n")
    with pytest.raises(NoUsableRecordsError, match=r"tools\.jsonl: no usable"):
        read_claude_code(only_tools)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(NoUsableRecordsError, match=r"empty\.jsonl: the file is empty"):
        read_claude_code(empty)


def test_fast_and_generic_attribute_paths_agree(tmp_path: Path) -> None:
    """The same record with and without a nested attribute (which disables the fast path)."""
    plain = api_request("s", 1, (4, 5, 6, 7))
    nested = api_request("s", 1, (4, 5, 6, 7), extra=[
        {"key": "x", "value": {"kvlistValue": {"values": [attr("a", "b")]}}}])
    (tmp_path / "a.jsonl").write_text(logs_line([plain]) + "\n")
    (tmp_path / "b.jsonl").write_text(logs_line([nested]) + "\n")
    a = read_claude_code(tmp_path / "a.jsonl").frame.drop(columns="source")
    b = read_claude_code(tmp_path / "b.jsonl").frame.drop(columns="source")
    pd.testing.assert_frame_equal(a, b)
    assert len(_reduce_attribute_lists(logs_line([plain]).encode())[1]) == 2  # fast path
    assert len(_reduce_attribute_lists(logs_line([nested]).encode())[1]) == 1  # resource only


def test_spaced_and_pretty_printed_json(tmp_path: Path) -> None:
    """Whitespace between tokens keeps the fast path; one indented document is read whole."""
    doc = json.loads(logs_line([api_request("s", 1, (4, 5, 6, 7))]))
    (tmp_path / "spaced.jsonl").write_text(json.dumps(doc) + "\n")
    (tmp_path / "pretty.json").write_text(json.dumps(doc, indent=2))
    (tmp_path / "pretty2.json").write_text(
        json.dumps(doc, indent=2).replace('{\n  "resourceLogs"', '{"resourceLogs"', 1))
    assert len(_reduce_attribute_lists(json.dumps(doc).encode())[1]) == 2
    for name in ("spaced.jsonl", "pretty.json", "pretty2.json"):
        frame = read_claude_code(tmp_path / name).frame
        assert frame[["input_tokens", "cache_creation_tokens"]].values.tolist() == [[4, 7]]


# ----------------------------------------------------------------------------- metrics


def metrics_line(points: list[tuple[str, int, int, int]], temporality: object,
                 name: str = "claude_code.token.usage") -> str:
    """points: (type, start_s, time_s, value) of one session's token.usage sum."""
    data_points = [{"attributes": [attr("type", kind), attr("session.id", "s1"),
                                   attr("model", "opus")],
                    "startTimeUnixNano": str(T0_NS + start * 10**9),
                    "timeUnixNano": str(T0_NS + t * 10**9), "asInt": str(value)}
                   for kind, start, t, value in points]
    metric = {"name": name, "unit": "tokens",
              "sum": {"aggregationTemporality": temporality, "isMonotonic": True,
                      "dataPoints": data_points}}
    return json.dumps({"resourceMetrics": [{"resource": {"attributes": [
        attr("service.name", "claude-code")]}, "scopeMetrics": [{"metrics": [metric]}]}]})


def test_metrics_delta_temporality(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join([
        metrics_line([("input", 0, 60, 5), ("cacheRead", 0, 60, 900), ("output", 0, 60, 40)], 1),
        metrics_line([("cacheCreation", 60, 120, 70), ("cacheRead", 60, 120, 1000),
                      ("cacheWrite", 60, 120, 1)], "AGGREGATION_TEMPORALITY_DELTA"),
        metrics_line([("x", 0, 60, 1)], 1, name="claude_code.cost.usage"),
    ]) + "\n")
    result = read_claude_code(path)
    assert result.signal == "metrics"
    f = result.frame
    assert f[["input_tokens", "output_tokens", "cache_read_tokens",
              "cache_creation_tokens"]].values.tolist() == [[5, 40, 900, 0], [0, 0, 1000, 70]]
    assert f.timestamp_s.tolist() == [T0_NS / 1e9 + 60, T0_NS / 1e9 + 120]
    assert set(f.source) == {"otlp-metrics"} and set(f.session_id) == {"s1"}
    assert result.skipped.reason.str.contains("cacheWrite").sum() == 1
    assert result.ignored == {"metric claude_code.cost.usage": 1}


def test_metrics_cumulative_to_deltas_with_resets(tmp_path: Path) -> None:
    """Cumulative cacheRead 100, 250, 250, then a drop (restart) to 30, then 80 with a new
    start time (another restart): deltas 100, 150, 0, 30, 80. Lines out of time order."""
    path = tmp_path / "cum.jsonl"
    path.write_text("\n".join([
        metrics_line([("cacheRead", 0, 120, 250)], 2),
        metrics_line([("cacheRead", 0, 60, 100)], 2),
        metrics_line([("cacheRead", 0, 180, 250), ("cacheRead", 200, 240, 30)],
                     "AGGREGATION_TEMPORALITY_CUMULATIVE"),
        metrics_line([("cacheRead", 300, 360, 80)], 2),
        metrics_line([("cacheRead", 0, 60, 1)], 0),
    ]) + "\n")
    result = read_claude_code(path)
    assert result.frame.cache_read_tokens.tolist() == [100, 150, 0, 30, 80]
    assert result.skip_counts().to_dict() == {
        "aggregationTemporality missing or unknown: 0": 1}


def test_logs_and_metrics_together(tmp_path: Path) -> None:
    logs = tmp_path / "logs.jsonl"
    logs.write_text(logs_line([api_request("s1", 5, (1, 2, 3, 4))]) + "\n")
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(metrics_line([("input", 0, 60, 1), ("cacheRead", 0, 60, 3)], 1) + "\n")
    auto = read_claude_code([logs, metrics])
    assert auto.signal == "logs" and len(auto.frame) == 1
    assert auto.set_aside == {"token.usage rows": 1}
    assert "set aside: token.usage rows 1" in auto.report()
    assert read_claude_code([logs, metrics], signal="metrics").frame.cache_read_tokens.tolist() \
        == [3]
    assert len(read_claude_code([logs, metrics], signal="both").frame) == 2


# ----------------------------------------------------------------------------- Loki, CSV


def loki_response(streams: list[dict]) -> dict:
    return {"status": "success", "data": {"resultType": "streams", "result": streams}}


@pytest.fixture
def loki_export(tmp_path: Path) -> Path:
    ts = [str(T0_NS + k * 10**9) for k in range(6)]
    json_line = {"body": "claude_code.api_request", "traceid": "",
                 "attributes": {"session.id": "s1", "event.name": "api_request",
                                "model": "opus", "input_tokens": "4", "output_tokens": 9,
                                "cache_read_tokens": "700", "cache_creation_tokens": "30"},
                 "resources": {"service.name": "claude-code"}}
    logfmt = ('attribute_event.name=api_request attribute_session.id=s2 attribute_model="opus 1m"'
              " attribute_input_tokens=1 attribute_output_tokens=2 attribute_cache_read_tokens=3"
              " attribute_cache_creation_tokens=4 resource_service.name=claude-code")
    streams = [
        {"stream": {"service_name": "claude-code", "exporter": "OTLP"},
         "values": [[ts[0], json.dumps(json_line)], [ts[1], logfmt],
                    [ts[2], '{"body": "claude_code.api_request", "attributes": {'],
                    [ts[3], "msg=claude_code.tool_result attribute_tool_name=Bash"]]},
        # Loki's native OTLP ingestion: the line is the body, attributes are labels or
        # structured metadata (third element of a value).
        {"stream": {"service_name": "claude-code", "event_name": "api_request",
                    "session_id": "s3", "model": "opus"},
         "values": [[ts[4], "claude_code.api_request",
                     {"structuredMetadata": {"input_tokens": "7", "output_tokens": "8",
                                             "cache_read_tokens": "9",
                                             "cache_creation_tokens": "10"}}]]},
        {"stream": {"service_name": "claude-code"}, "values": [["bad", "x=1"]]},
    ]
    path = tmp_path / "loki.json"
    path.write_text(json.dumps(loki_response(streams), indent=1))
    return path


def test_loki_json_logfmt_and_labels(loki_export: Path) -> None:
    result = read_claude_code(loki_export)
    f = result.frame
    assert f.session_id.tolist() == ["s1", "s2", "s3"]
    assert f.model.tolist() == ["opus", "opus 1m", "opus"]
    assert f[["input_tokens", "output_tokens", "cache_read_tokens",
              "cache_creation_tokens"]].values.tolist() == [[4, 9, 700, 30], [1, 2, 3, 4],
                                                            [7, 8, 9, 10]]
    assert f.timestamp_s.tolist() == [T0_NS / 1e9 + k for k in (0, 1, 4)]
    assert set(f.source) == {"loki"}
    assert result.ignored == {"claude_code.tool_result": 1}
    where = dict(zip(result.skipped.record, result.skipped.reason, strict=True))
    assert where == {"result[0].values[2]": "log line starts with '{' but is not valid JSON",
                     "result[2].values[0]": "time 'bad' is not integer nanoseconds"}


def test_csv_export(tmp_path: Path) -> None:
    path = tmp_path / "requests.csv"
    path.write_text(
        "event.timestamp,session.id,model,input_tokens,output_tokens,cache_read_tokens,"
        "cache_creation_tokens,cost_usd\n"
        "2026-03-02T00:00:01Z,s1,opus,1,2,3,4,0.1\n"
        "1772409602000,s1,opus,5,6,7,,0.2\n"  # epoch in ms; missing creation -> 0
        "2026-03-02T00:00:03Z,s1,opus,1,2\n"  # too few fields
        "2026-03-02T00:00:04Z,s1,opus,x,2,3,4,0.1\n"
        "\n")
    result = read_claude_code(path)
    assert result.frame[["input_tokens", "cache_creation_tokens"]].values.tolist() == [[1, 4],
                                                                                      [5, 0]]
    assert result.frame.timestamp_s.tolist() == [T0_NS / 1e9 + 1, T0_NS / 1e9 + 2]
    assert result.skipped[["line", "reason"]].values.tolist() == [
        [4, "row has 5 fields, header 8"], [5, "input_tokens is not an integer: 'x'"]]


def test_gzip_inputs_read_like_plain_ones(tmp_path: Path, otlp_logs: Path,
                                          loki_export: Path) -> None:
    csv_path = tmp_path / "r.csv"
    csv_path.write_text("session_id,input_tokens,output_tokens\ns,1,2\n")
    for plain in (otlp_logs, loki_export, csv_path):
        packed = tmp_path / (plain.name + ".gz")
        packed.write_bytes(gzip.compress(plain.read_bytes()))
        pd.testing.assert_frame_equal(read_claude_code(packed).frame,
                                      read_claude_code(plain).frame)


# ----------------------------------------------------------------------------- bad bytes


def test_otlp_line_that_is_not_utf8_is_a_skipped_line(tmp_path: Path) -> None:
    """A byte that is not UTF-8 made the reader raise AttributeError ('UnicodeDecodeError'
    has no 'msg'); inside an attribute value, which the fast path reads by regex, it was
    not even seen. Either way the line is one malformed line: skipped (lax) or an error
    naming file and line (strict)."""
    lines = [logs_line([api_request("s1", k, (k, 2, 3, 4))]).encode() for k in range(4)]
    lines[1] = lines[1].replace(b'"s1"', b'"s\xff1"')       # inside an attribute value
    lines[2] = lines[2].replace(b'"scopeLogs"', b'"scope\xfeLogs"')  # outside the lists
    lines[3] = b"\x00" + lines[3]  # ASCII, but json.loads(bytes) took it for UTF-16
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = read_claude_code(path)
    assert result.frame.input_tokens.tolist() == [0]
    assert result.skipped.line.tolist() == [2, 3, 4]
    column, column_2 = lines[1].index(b"\xff") + 1, lines[2].index(b"\xfe") + 1
    assert result.skipped.reason.tolist()[:2] == [
        f"not UTF-8 text (byte 0xff at column {column}: invalid start byte)",
        f"not UTF-8 text (byte 0xfe at column {column_2}: invalid start byte)"]
    assert result.skipped.reason.iloc[2].startswith("invalid JSON (Expecting value")
    with pytest.raises(TelemetryFormatError,
                       match=rf"^{path}:2: not UTF-8 text \(byte 0xff at column {column}"):
        read_claude_code(path, strict=True)


def test_a_bad_first_byte_does_not_make_an_otlp_export_a_csv(tmp_path: Path) -> None:
    path = tmp_path / "first.jsonl"
    path.write_bytes(b"\xff" + logs_line([api_request("s", 1, (1, 2, 3, 4))]).encode() + b"\n"
                     + logs_line([api_request("s", 2, (5, 6, 7, 8))]).encode() + b"\n")
    result = read_claude_code(path)
    assert result.frame.input_tokens.tolist() == [5]
    assert result.skipped.line.tolist() == [1]


def test_loki_and_csv_lines_that_are_not_utf8_are_skipped(tmp_path: Path,
                                                          loki_export: Path) -> None:
    paged = tmp_path / "paged.jsonl"  # one query response per line (a paged export)
    good = json.dumps(json.loads(loki_export.read_text())).encode()
    paged.write_bytes(good + b"\n" + good.replace(b"claude_code", b"claude\xc0code", 1) + b"\n")
    result = read_claude_code(paged)
    assert len(result.frame) == len(read_claude_code(loki_export).frame)
    [reason] = result.skipped.reason[result.skipped.line == 2]
    assert reason.startswith("not UTF-8 text (byte 0xc0 at column")
    csv_path = tmp_path / "r.csv"
    csv_path.write_bytes(b"session_id,input_tokens,output_tokens\ns,1,2\ns\xff,3,4\nt,5,6\n")
    result = read_claude_code(csv_path)
    assert result.frame.input_tokens.tolist() == [1, 5]
    assert result.skipped[["line", "reason"]].values.tolist() == [
        [3, "not UTF-8 text (byte 0xff in field 'session_id')"]]
    with pytest.raises(TelemetryFormatError, match=rf"^{csv_path}:3: not UTF-8"):
        read_claude_code(csv_path, strict=True)


def test_truncated_gzip_export_keeps_what_was_read(tmp_path: Path) -> None:
    shipped = ROOT / "data" / "samples" / "claude_code_otlp_sample.jsonl.gz"
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(shipped.read_bytes()[:30_000])  # about half of it
    result = read_claude_code(path)
    assert 0 < len(result.frame) < len(read_claude_code(shipped).frame)
    assert result.skipped.reason.tolist() == [
        "unreadable after this point (Compressed file ended before the end-of-stream marker "
        "was reached); truncated file?"]
    with pytest.raises(TelemetryFormatError, match=rf"^{path}: unreadable after this point"):
        read_claude_code(path, strict=True)


# ----------------------------------------------------------------------------- token mix


def test_token_mix_exact_shares() -> None:
    frame = pd.DataFrame({
        "timestamp_s": [T0_NS / 1e9, T0_NS / 1e9 + 86_400, T0_NS / 1e9 + 86_401],
        "session_id": ["a", "b", "b"], "model": ["opus", "opus", "haiku"],
        "input_tokens": [10, 80, 10], "output_tokens": [30, 200, 70],
        "cache_read_tokens": [900, 7_000, 1_100], "cache_creation_tokens": [60, 520, 20],
        "source": "csv"})
    mix = token_mix(frame)
    assert mix.token_type.tolist() == ["cache_read", "cache_creation", "output", "input"]
    assert mix.tokens.tolist() == [9_000, 600, 300, 100]
    assert mix_shares(mix) == pytest.approx({"cache_read": 90.0, "cache_creation": 6.0,
                                             "output": 3.0, "input": 1.0})
    by_session = token_mix(frame, by="session").set_index(["session_id", "token_type"])
    assert by_session.share_pct[("a", "cache_read")] == pytest.approx(90.0)
    assert by_session.tokens[("b", "output")] == 270
    by_day = token_mix(frame, by="day")
    assert sorted(by_day.day.unique()) == ["2026-03-02", "2026-03-03"]
    assert by_day.groupby("day").share_pct.sum().tolist() == pytest.approx([100.0, 100.0])
    by_model = token_mix(frame, by="model").set_index(["model", "token_type"])
    assert by_model.share_pct[("haiku", "cache_read")] == pytest.approx(1100 / 1200 * 100)
    with pytest.raises(KeyError, match="cannot group by"):
        token_mix(frame, by="user")


# ----------------------------------------------------------------------------- synthetic


def hand_session() -> pd.DataFrame:
    """Session 0: requests at 0, 10, 20 and 400 s (a 380 s gap); session 1 at 390 s."""
    return pd.DataFrame({
        "session_id": [0, 0, 0, 0, 1], "turn": [0, 1, 2, 3, 0],
        "send_s": [0.0, 10.0, 20.0, 400.0, 390.0],
        "prompt_tokens": [20_000, 21_000, 23_000, 24_000, 16_000],
        "output_tokens": [100, 200, 300, 400, 50], "tail_tokens": [5, 5, 5, 5, 3]})


def test_prompt_cache_rules_on_a_hand_built_session() -> None:
    out = synth.apply_prompt_cache(hand_session(), ttl_s=300, shared_prefix_tokens=0)
    assert out.cache_read_tokens.tolist() == [0, 19_995, 20_995, 0, 0]
    assert out.cache_creation_tokens.tolist() == [19_995, 1_000, 2_000, 23_995, 15_997]
    assert out.input_tokens.tolist() == [5, 5, 5, 5, 3]
    assert out.cache_status.tolist() == ["first", "hit", "hit", "expired", "first"]
    total = out.cache_read_tokens + out.cache_creation_tokens + out.input_tokens
    assert total.tolist() == out.prompt_tokens.tolist()


def test_shared_system_prompt_and_longer_ttl() -> None:
    shared = synth.apply_prompt_cache(hand_session(), ttl_s=300, shared_prefix_tokens=15_000)
    # session 1 at 390 s finds the system prompt cold (last use 20 s); session 0's miss at
    # 400 s reads it, because session 1 used it 10 s before.
    assert shared.cache_read_tokens.tolist() == [0, 19_995, 20_995, 15_000, 0]
    assert shared.cache_creation_tokens.tolist()[3] == 23_995 - 15_000
    hour = synth.apply_prompt_cache(hand_session(), ttl_s=3600)
    assert hour.cache_status.tolist()[3] == "hit"
    assert hour.cache_read_tokens.tolist()[3] == 22_995


def test_compaction_starts_a_new_prefix() -> None:
    req = hand_session().assign(context_start_turn=[0, 0, 2, 2, 0])
    out = synth.apply_prompt_cache(req, ttl_s=3600)
    assert out.cache_status.tolist()[2:4] == ["compacted", "hit"]
    assert out.cache_read_tokens.tolist()[2] == 0


def small_spec(**changes: object) -> synth.SyntheticClaudeCodeSpec:
    agentic = synth.week_of_coding(duration_s=6 * 3600, session_rate_per_min=0.02,
                                   context_cap_tokens=200_000)
    return synth.SyntheticClaudeCodeSpec(agentic=agentic, **changes)


def test_synthetic_export_is_deterministic_and_reads_back(tmp_path: Path) -> None:
    spec = small_spec(seed=3)
    first = synth.generate_claude_code_export(tmp_path / "a.jsonl.gz", spec)
    synth.generate_claude_code_export(tmp_path / "b.jsonl.gz", spec)
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()
    read = read_claude_code(tmp_path / "a.jsonl.gz")
    assert len(read.skipped) == 0 and read.ignored == {}
    for column in ("input_tokens", "output_tokens", "cache_read_tokens",
                   "cache_creation_tokens"):
        assert read.frame[column].sum() == first[column].sum()
    assert read.frame.session_id.nunique() == first.session_id.nunique()
    other = synth.synthetic_requests(small_spec(seed=4))
    assert not other[["prompt_tokens"]].equals(first[["prompt_tokens"]])


def test_shipped_sample_matches_its_generator(tmp_path: Path) -> None:
    shipped = ROOT / "data" / "samples" / "claude_code_otlp_sample.jsonl.gz"
    assert shipped.stat().st_size < 1_000_000
    synth.generate_claude_code_export(tmp_path / "s.jsonl.gz", synth.sample_spec())
    assert gzip.decompress(shipped.read_bytes()) == \
        gzip.decompress((tmp_path / "s.jsonl.gz").read_bytes())


def test_mix_sweep_and_figures() -> None:
    sweep = synth.mix_sweep(small_spec(), mean_turns=(10, 80), pause_means_s=(60.0,),
                            ttls_s=(300.0, 3600.0))
    read = sweep[sweep.token_type == "cache_read"].set_index(["mean_turns", "ttl_s"]).share_pct
    assert read[(80, 300.0)] > read[(10, 300.0)]
    assert read[(80, 3600.0)] >= read[(80, 300.0)]
    assert sweep.groupby(["mean_turns", "ttl_s"]).share_pct.sum().to_numpy() == \
        pytest.approx(np.full(4, 100.0))
    fig = tokenmix_sweep(sweep, study_pct={"cache_read": 98.16})
    assert isinstance(fig, plt.Figure) and len(fig.axes) == 4
    mix = token_mix(synth.synthetic_requests(small_spec()))
    fig = a1_token_mix(mix)
    assert fig.axes[0].get_title().startswith("A1")
    assert "%" in fig.axes[0].get_xlabel()
    with pytest.raises(ValueError, match=r"figure A1: data lacks column\(s\) \['share_pct'\]"):
        a1_token_mix(mix.drop(columns="share_pct"))


# ----------------------------------------------------------------------------- the fast OTLP path


def _plain_attrs(listed: list[dict]) -> dict[str, object]:
    """OTLP attributes read the plain way: the value of the kind each one has."""
    out = {}
    for item in listed:
        value = item.get("value") or {}
        out[item["key"]] = next((value[k] for k in ("stringValue", "intValue", "doubleValue")
                                 if k in value), None)
    return out


def _plain_counts(attrs: dict[str, object]) -> tuple[int, ...]:
    """The four token counts of an api_request; ValueError with the reader's reason."""
    counts = []
    for column in ("input_tokens", "output_tokens", "cache_read_tokens",
                   "cache_creation_tokens"):
        value = attrs.get(column)
        try:
            count = None if value is None else int(value)
        except ValueError:
            raise ValueError(f"{column} is not an integer: {value!r}") from None
        if count is not None and count < 0:
            raise ValueError(f"{column} is negative: {count}")
        counts.append(count)
    if all(c is None for c in counts):
        raise ValueError("api_request without any token count")
    return tuple(c or 0 for c in counts)


def _plain_read(data: bytes, path: str) -> tuple[list[tuple], list[tuple], Counter]:
    """An OTLP logs export read line by line with the `json` module, written apart from
    the reader: rows, skips (file, line, record, reason) and ignored event names."""
    rows, skips, ignored = [], [], Counter()
    for line_no, raw in enumerate(data.splitlines(keepends=True), 1):  # "\n" kept as read
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            skips.append((path, line_no, "", f"not UTF-8 text (byte 0x{raw[err.start]:02x} "
                          f"at column {err.start + 1}: {err.reason})"))
            continue
        except json.JSONDecodeError as err:
            skips.append((path, line_no, "", f"invalid JSON ({err.msg})"))
            continue
        if "resourceLogs" not in doc:
            skips.append((path, line_no, "",
                          "not an OTLP export (no resourceLogs/resourceMetrics)"))
            continue
        for i, resource in enumerate(doc["resourceLogs"]):
            res = _plain_attrs(resource.get("resource", {}).get("attributes", []))
            for j, scope in enumerate(resource["scopeLogs"]):
                for k, rec in enumerate(scope["logRecords"]):
                    attrs = _plain_attrs(rec.get("attributes", []))
                    name = (rec.get("body") or {}).get("stringValue") or \
                        f"claude_code.{attrs['event.name']}"
                    if name != "claude_code.api_request":
                        ignored[name] += 1
                        continue
                    try:
                        counts = _plain_counts(attrs)
                    except ValueError as err:
                        skips.append((path, line_no,
                                      f"resourceLogs[{i}].scopeLogs[{j}].logRecords[{k}]",
                                      str(err)))
                        continue
                    rows.append((int(rec["timeUnixNano"]) / 1e9,
                                 attrs.get("session.id") or res.get("session.id"),
                                 attrs.get("model") or res.get("model"), *counts, "otlp-logs"))
    return rows, skips, ignored


def _corrupted_export(lines: list[bytes]) -> list[bytes]:
    """Generated lines with the variations and damage of real exports at known lines."""
    lines = list(lines)
    token = rb'\{"key":"%s","value":\{"intValue":"[0-9]+"\}\}'
    lines[2] = lines[2][:len(lines[2]) // 2]  # cut short
    lines[9] = lines[9][:300] + b"\xff" + lines[9][300:]  # not UTF-8
    lines[19] = re.sub(token % b"input_tokens", b'{"key":"input_tokens","value":'
                       b'{"stringValue":"abc"}}', lines[19])
    lines[29] = re.sub(token % b"output_tokens", b'{"key":"output_tokens","value":'
                       b'{"intValue":"-5"}}', lines[29])
    lines[39] = re.sub(rb"," + token % rb"[a-z_]+_tokens", b"", lines[39])  # no count
    lines[49] = b'{"unexpected": true}'
    lines[59] = lines[59].replace(b'"attributes":[', b'"attributes":[{"key":"paths","value":'
                                  b'{"arrayValue":{"values":[{"stringValue":"/a"}]}}},', 2)
    lines[69] = lines[69].replace(b'"session.id","value":{"stringValue":"',
                                  b'"session.id","value":{"stringValue":"\\u0041', 1)
    lines[79] = json.dumps(json.loads(lines[79])).encode()  # spaces after separators
    doc = json.loads(lines[89])
    doc["resourceLogs"][0]["resource"]["attributes"].append(attr("session.id", "from-res"))
    records = doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"]
    records.append({**records[0], "body": {"stringValue": "claude_code.tool_result"}})
    records.append({**records[0], "body": None})  # named by event.name only
    for rec in records:
        rec["attributes"] = [a for a in rec["attributes"] if a["key"] != "session.id"]
    lines[89] = json.dumps(doc, separators=(",", ":")).encode()
    lines.insert(95, b"   ")
    return lines


def test_fast_otlp_path_reads_as_a_plain_json_reading(tmp_path: Path) -> None:
    """The reader (msgspec for most lines, the general path for the others) gives the rows,
    skips and ignored counts of a plain `json` reading, on a generated export with damaged
    and unusual lines; the clean lines do take the msgspec path."""
    spec = small_spec(seed=3)
    clean = [line.encode() for line in synth.otlp_log_lines(synth.synthetic_requests(spec),
                                                            spec)]
    lines = _corrupted_export(clean)
    path = tmp_path / "export.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    rows, skips, ignored = _plain_read(path.read_bytes(), str(path))
    result = read_claude_code(path)
    assert dict(result.frame.dtypes.astype(str)) == FRAME_DTYPES
    assert list(result.frame.itertuples(index=False, name=None)) == rows
    assert list(result.skipped.itertuples(index=False, name=None)) == skips
    assert result.ignored == dict(ignored) == {"claude_code.tool_result": 1}
    assert len(rows) > 600 and [s[1] for s in skips] == [3, 10, 20, 30, 30, 40, 50]
    sessions = result.frame.session_id
    assert sessions.str.startswith("A").sum() == 1  # the escape, decoded
    assert (sessions == "from-res").sum() == 2  # the resource's, for records without one
    general = [n for n, line in enumerate(lines, 1)  # the reader checks UTF-8 first
               if line.strip() and line.isascii() and _msgspec_logs(line, {}) is None]
    assert general == [3, 20, 30, 40, 50, 60, 80]  # skipped, nested value, spaced
    with pytest.raises(TelemetryFormatError, match=rf"^{path}:3: invalid JSON"):
        read_claude_code(path, strict=True)
