"""Claude Code's OpenTelemetry telemetry: token counts per API request, and their mix (A1).

Study A's figure A1 splits one week of Claude Code traffic into tokens by type: cache reads,
cache creation (writes), output and uncached input. Claude Code reports these numbers itself
when telemetry is on (`CLAUDE_CODE_ENABLE_TELEMETRY=1`, see Claude Code's "Monitoring" docs):

* log event `claude_code.api_request` (OTLP logs), one per API request, with attributes
  `input_tokens`, `output_tokens`, `cache_read_tokens`, `cache_creation_tokens`, `model`,
  `session.id`, `event.name` (`api_request`), `event.timestamp` (ISO 8601), `event.sequence`,
  `cost_usd`, `duration_ms`, ...; the body is the event name `claude_code.api_request`;
* metric `claude_code.token.usage` (OTLP sum, unit tokens), attribute `type` in `input` /
  `output` / `cacheRead` / `cacheCreation`, plus `model` and `session.id`.

`read_claude_code` reads three export formats, plain or gzip (detected by content):

* OTLP JSON lines as an OpenTelemetry collector's file exporter writes them: one
  `{"resourceLogs": [...]}` or `{"resourceMetrics": [...]}` per line, attributes as
  `[{"key": k, "value": {"stringValue" | "intValue" | "doubleValue": v}}]` (a single
  pretty-printed document also works);
* a Loki query API response as Grafana/Loki export it, `{"data": {"result": [{"stream":
  {labels}, "values": [[ts_ns, line], ...]}]}}`, each line a JSON log record or logfmt (or the
  bare body, with the attributes in the stream labels / structured metadata);
* a flat CSV, one row per api_request, with the attribute names as columns.

Real exports vary, and the reader accepts the variations it knows of: integers as strings
(proto3 JSON writes int64 as `"123"`), the event name in the body or only in `event.name`,
missing optional fields (tokens default to 0, session and model to None, the time to NaN),
extra fields. Everything else it cannot use is skipped, counted with its reason and the
file:line (and the record inside the line) in `ClaudeCodeTelemetry.skipped`; with
`strict=True` the first such record raises `TelemetryFormatError` instead. A line (CSV: a
row) holding a byte that is not UTF-8 is such a record, skipped whole; so is the rest of a
gzip file that ends early. Other events and
metrics (tool_result, cost.usage, ...) are not errors: they are counted in `ignored`.

Files are streamed line by line with a bound, `max_line_bytes` (default
`kvrepro._lines.MAX_LINE_BYTES`): a longer line (a cut export, a file without newlines) is
read past without being held, and is such an unusable record (strict: an error naming file,
line and limit). A single JSON document spread over lines (pretty-printed OTLP, a Loki
response) is read whole only up to the same bound; a bigger one is an error naming the limit.

Metrics in cumulative temporality are turned into deltas per series (resource + point
attributes); a value below the previous one, or a new `startTimeUnixNano`, is a reset and
counts from zero again. A series' first point counts whole: Claude Code starts one series per
session (`session.id` is an attribute), so the first point holds that session's first tokens.

Speed (benchmarks/bench_otlp.py): a line of log records is decoded by msgspec into typed
structs that keep each attribute list as raw JSON; one regex match of a list checks that it
holds only compact scalar attributes (the collector's layout) and picks out the raw values
of the eight attributes a row needs, so Python handles no attribute, not even those.
Every other line (metrics, spans, spaced or pretty JSON, nested values, anything skipped)
goes through the general path: the all-scalar attribute lists replaced by a marker before
`json.loads`, and the needed attributes read with one regex pass. Both paths read the same
raw values with the same functions (`_log_row`), so they give the same rows; the msgspec
path only takes a line that reads without a skip, and leaves the rest to the general one.
"""

from __future__ import annotations

import csv
import gzip
import json
import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain
from pathlib import Path
from typing import IO, Any, Literal, NamedTuple

import msgspec
import numpy as np
import pandas as pd

from kvrepro._checks import UNDECODABLE_RE, not_utf8
from kvrepro._lines import MAX_LINE_BYTES, bounded_lines, line_too_long

TOKEN_COLUMNS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens")
FRAME_DTYPES: dict[str, str] = {
    "timestamp_s": "float64", "session_id": "object", "model": "object",
    **dict.fromkeys(TOKEN_COLUMNS, "int64"), "source": "object",
}
SKIP_COLUMNS = ["file", "line", "record", "reason"]
API_REQUEST = "claude_code.api_request"
TOKEN_METRIC = "claude_code.token.usage"
METRIC_TYPES = {"input": "input_tokens", "output": "output_tokens",
                "cacheRead": "cache_read_tokens", "cacheCreation": "cache_creation_tokens"}
MIX_TYPES = {"cache_read": "cache_read_tokens", "cache_creation": "cache_creation_tokens",
             "output": "output_tokens", "input": "input_tokens"}
"""Token types of the mix in the study's order, and the frame column each one sums."""
MIX_LABELS = {"cache_read": "cache read", "cache_creation": "cache creation",
              "output": "output", "input": "uncached input"}
ExportFormat = Literal["auto", "otlp", "loki", "csv"]
Signal = Literal["auto", "logs", "metrics", "both"]


class TelemetryFormatError(ValueError):
    """A record the reader cannot use (raised with `strict=True`); the message starts with
    file:line so the record can be found in the export."""


class NoUsableRecordsError(ValueError):
    """A file held no usable api_request event nor token.usage data point."""


class _Skip(Exception):
    """Internal: the current record is unusable; the message is the reason."""


# ----------------------------------------------------------------------------- value helpers


def _text(value: Any) -> str | None:
    """An attribute value as text; raw JSON bytes (the OTLP fast path) are decoded."""
    if type(value) is bytes:  # tested first: the OTLP paths call this twice a row
        if value[:1] == b'"':
            return _json_string(value) if _BACKSLASH in value else value[1:-1].decode()
        return value.decode() or None
    if value is None or value == "":
        return None
    return value if isinstance(value, str) else str(value)


_BACKSLASH = ord("\\")
"""As an int, `in` finds the byte with memchr (~5x faster than the one-byte `b"\\\\"`)."""


def _json_string(raw: bytes) -> str:
    """A raw JSON string of the fast path, which `json.loads` of the line did not check
    (attribute lists are read by regex): a bad escape makes the record a skip."""
    try:
        return json.loads(raw)
    except ValueError:
        raise _Skip(f"attribute text {raw[:60]!r} is not a valid JSON string") from None


def _invalid_json(exc: ValueError) -> str:
    """The reason of a failed `json.loads` of bytes (not UTF-8, or not JSON)."""
    if isinstance(exc, UnicodeDecodeError):
        return not_utf8(exc)[1]
    return f"invalid JSON ({getattr(exc, 'msg', exc)})"


def _count(value: Any, name: str) -> int | None:
    """A token count: int, float with no fraction, or either as text; None if missing."""
    if type(value) is bytes:  # the fast path: raw JSON of an intValue
        try:
            number = int(value.strip(b'"'))
        except ValueError:
            pass
        else:
            if 0 <= number < _INT64_END:
                return number
    if value is None or value == b"" or value == "":
        return None
    if isinstance(value, bytes):
        value = value.strip(b'"').decode()
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            try:
                value = float(value)
            except ValueError:
                raise _Skip(f"{name} is not an integer: {value!r}") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Skip(f"{name} is not an integer: {value!r}")
    if value < 0:
        raise _Skip(f"{name} is negative: {value}")
    if value >= _INT64_END:
        raise _Skip(f"{name} is too large for a token count: {value}")
    return value


def _nanos_to_s(value: Any) -> float | None:
    """Unix nanoseconds (int or text) to seconds; 0 or missing means unknown (None)."""
    if value is None or value == "":
        return None
    try:
        nanos = int(value)
        return nanos / 1e9 if nanos > 0 else None
    except (TypeError, ValueError, OverflowError):
        raise _Skip(f"time {str(value)[:60]!r} is not integer nanoseconds") from None


def _any_time_to_s(value: Any) -> float | None:
    """A timestamp as ISO 8601 text or as a Unix epoch in s, ms, us or ns (by magnitude)."""
    text = _text(value)
    if text is None:
        return None
    try:
        epoch = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.strip())
        except ValueError:
            raise _Skip(f"timestamp {text!r} is neither ISO 8601 nor a Unix epoch") from None
        if moment.tzinfo is None:  # exports write UTC; a naive time is taken as UTC
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    for threshold, scale in ((1e17, 1e9), (1e14, 1e6), (1e11, 1e3)):
        if epoch > threshold:
            return epoch / scale
    return epoch if epoch > 0 else None


def _canonical_event(name: str | None) -> str | None:
    """`api_request` and `claude_code.api_request` name the same event."""
    if not name:
        return None
    return name if name.startswith("claude_code.") else f"claude_code.{name}"


# ----------------------------------------------------------------------------- OTLP fast path

_STR = rb'(?>"[^"\\]*+(?:\\.[^"\\]*+)*+")'
_SCALAR = rb"(?:" + _STR + rb"|-?[0-9][-+0-9.eE]*+|true|false|null)"
# Atomic groups and possessive quantifiers (Python >= 3.11): a JSON token never needs
# backtracking, and forbidding it makes these patterns ~40 % faster.


def _attr_pattern(key: bytes, capture: bool) -> bytes:
    """Regex of one scalar attribute object; `key` is the regex of its quoted name."""
    key, value = (b"(" + key + b")", b"(" + _SCALAR + b")") if capture else (key, _SCALAR)
    parts = [rb"\{", rb'"key"', b":", key, b",", rb'"value"', b":", rb"\{",
             rb'(?:"[A-Za-z]+"\s*+:\s*+' + value + b")?", rb"\}", rb"\}"]
    return rb"\s*+".join(parts)


def _key(name: str) -> bytes:
    return json.dumps(name).encode()


_LOG_KEYS = (*TOKEN_COLUMNS, "model", "session.id", "event.name", "event.timestamp")
_ATTR_RE = re.compile(_attr_pattern(_STR, capture=True))
"""One scalar OTLP attribute; groups: the key and the value as raw JSON (quoted if text)."""
_LOG_ATTR_RE = re.compile(_attr_pattern(
    b'"(?:' + b"|".join(re.escape(k.encode()) for k in _LOG_KEYS) + b')"', capture=True))
"""Only the attributes an api_request row needs: skipping the others in C, not Python, is
what makes the log path fast (real records carry ~20 attributes)."""
_ATTR_LIST_RE = re.compile(rb'"attributes"\s*+:\s*+\[\s*+((?:' + _attr_pattern(_STR, False)
                           + rb")(?:\s*+,\s*+" + _attr_pattern(_STR, False) + rb")*+)?\s*+\]")
"""A whole attribute list whose every element is a scalar attribute (the common case)."""
_MARK = "\x00"
_INT64_END = 2**63
"""Token counts must fit the frame's int64 columns."""


_LOG_KEY_BYTES = tuple(_key(k) for k in _LOG_KEYS)
"""The keys as the raw JSON of the general path's `_attrs` spells them."""
_AT_MODEL, _AT_SESSION, _AT_EVENT, _AT_EVENT_TS = (
    _LOG_KEYS.index(k) for k in ("model", "session.id", "event.name", "event.timestamp"))
"""Positions in `_LOG_KEYS` (the token counts come first, in `TOKEN_COLUMNS` order)."""
_ABSENT = object()
"""`_log_values`: a key the mapping does not hold."""


def _reduce_attribute_lists(raw: bytes) -> tuple[bytes, list[tuple[int, int]]]:
    """Replace each all-scalar attribute list by a marker string; return the spans of the
    lists in `raw`, so `json.loads` builds one small string per list instead of two dicts
    per attribute. Lists with nested values (arrays, maps) stay JSON and are read normally."""
    spans: list[tuple[int, int]] = []

    def mark(match: re.Match[bytes]) -> bytes:
        if match.group(1) is None:
            return b'"attributes":[]'
        spans.append(match.span(1))
        return b'"attributes":"\\u0000%d"' % (len(spans) - 1)

    return _ATTR_LIST_RE.sub(mark, raw), spans


def _any_value(value: Any) -> Any:
    """The payload of an OTLP AnyValue object (`{"intValue": "5"}` -> "5")."""
    if not isinstance(value, dict):
        return value
    for kind in ("stringValue", "intValue", "doubleValue", "boolValue", "bytesValue"):
        if kind in value:
            return value[kind]
    return value or None


def _attrs(value: Any, raw: bytes, spans: list[tuple[int, int]],
           pattern: re.Pattern[bytes] = _ATTR_RE) -> dict[bytes, Any]:
    """Attributes keyed by their JSON-quoted name; values raw JSON bytes or Python values.

    A marked list is read from `raw` with `pattern` (all attributes, or only the log keys)."""
    if type(value) is str and value[:1] == _MARK:
        try:
            start, end = spans[int(value[1:])]
        except (ValueError, IndexError):  # the line itself holds a string like the marker
            raise _Skip(f"attributes {value!r} is not an attribute list") from None
        return dict(pattern.findall(raw, start, end))
    if value is None:
        return {}
    if not isinstance(value, list):
        raise _Skip("'attributes' is not a list")
    out: dict[bytes, Any] = {}
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise _Skip("attribute without a 'key'")
        out[_key(item["key"])] = _any_value(item.get("value"))
    return out


def _py_attrs(attrs: Mapping[bytes, Any]) -> dict[str, Any]:
    """Attributes with plain names and Python values (for metric series identity)."""
    out = {}
    for key, value in attrs.items():
        name = _json_string(key) if isinstance(key, bytes) else key
        out[name] = _text(value) if isinstance(value, bytes) else value
    return out


def _as_list(value: Any, what: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Skip(f"'{what}' is not a list")
    return value


def _dict_get(value: Any, key: str, what: str) -> Any:
    if not isinstance(value, dict):
        raise _Skip(f"{what} is not a JSON object")
    return value.get(key)


def _body_event(body: Any) -> str | None:
    """The event name when the log body carries it (`claude_code.<event>`)."""
    if isinstance(body, dict):
        body = body.get("stringValue")
    if isinstance(body, str) and body.startswith("claude_code."):
        return body
    return None


def _row(time_s: float | None, session: Any, model: Any, tokens: Sequence[Any],
         source: str) -> tuple:
    """One api_request row of the frame; raises _Skip if a count is unusable or all are
    missing."""
    read_in, out, read, create = tokens  # unrolled: this runs once per row
    name_in, name_out, name_read, name_create = TOKEN_COLUMNS
    counts = (_count(read_in, name_in), _count(out, name_out), _count(read, name_read),
              _count(create, name_create))
    if counts == _NO_COUNTS:
        raise _Skip("api_request without any token count")
    read_in, out, read, create = counts
    return (np.nan if time_s is None else time_s, _text(session), _text(model),
            read_in or 0, out or 0, read or 0, create or 0, source)


_NO_COUNTS = (None,) * len(TOKEN_COLUMNS)


def _log_row(body: Any, time_ns: Any, observed_ns: Any, values: Sequence[Any],
             res: Sequence[Any]) -> tuple | str:
    """A log record's api_request row, or the name it is counted under in `ignored`;
    raises _Skip. `values`, `res`: the record's and the resource's attributes in
    `_LOG_KEYS` order (`_log_values`), None where absent."""
    name = _body_event(body) or _canonical_event(_text(values[_AT_EVENT]))
    tokens = values[:len(TOKEN_COLUMNS)]
    if name != API_REQUEST:
        if name is not None or tokens == _NO_COUNTS:  # no token attribute at all
            return name or "(unnamed log record)"
    time_s = (_nanos_to_s(time_ns) or _any_time_to_s(values[_AT_EVENT_TS])
              or _nanos_to_s(observed_ns))
    return _row(time_s, values[_AT_SESSION] or res[_AT_SESSION],
                values[_AT_MODEL] or res[_AT_MODEL], tokens, "otlp-logs")


def _log_values(attrs: Mapping[bytes, Any]) -> tuple:
    """`_attrs`'s mapping as `_log_row` takes it: the values of `_LOG_KEYS` in order, None
    for a key that is absent and b"" for one without a value (both read as missing; only
    presence tells an unnamed record with a token attribute from another event)."""
    values = (attrs.get(key, _ABSENT) for key in _LOG_KEY_BYTES)
    return tuple(None if v is _ABSENT else b"" if v is None else v for v in values)


# ----------------------------------------------------------------------------- OTLP logs, msgspec


class _Resource(msgspec.Struct, gc=False):
    """A resource; its attributes stay raw JSON (JSON null too is a Raw; None: absent)."""

    attributes: msgspec.Raw = None


class _LogRecord(msgspec.Struct, gc=False):
    """The fields a log row reads; msgspec skips (and validates) the others in C."""

    timeUnixNano: Any = None
    observedTimeUnixNano: Any = None
    body: Any = None
    attributes: msgspec.Raw = None


class _ScopeLogs(msgspec.Struct, gc=False):
    """A scope's log records (its name and version are skipped)."""

    logRecords: list[_LogRecord] | None = None


class _ResourceLogs(msgspec.Struct, gc=False):
    """A resource and its scopes."""

    resource: _Resource | None = None
    scopeLogs: list[_ScopeLogs] | None = None


class _LogsLine(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A line of log records only: metrics and spans take the general path."""

    resourceLogs: list[_ResourceLogs]


_LOGS_DECODER = msgspec.json.Decoder(_LogsLine)


def _compact_list_re(text: bytes) -> re.Pattern[bytes]:
    """A whole attribute list of compact scalar attributes (as the collector writes them),
    or JSON null; one group per key of `_LOG_KEYS`: the raw value of its last attribute,
    b"" for one without a value, None if absent. `text`: the regex of a JSON string."""
    scalar = rb"(?:" + text + rb"|-?[0-9][-+0-9.eE]*+|true|false|null)"
    needed = [re.escape(key) + rb',"value":\{(?:"[A-Za-z]++":)?+(' + scalar + rb"|)\}\}"
              for key in _LOG_KEY_BYTES]
    other = text + rb',"value":\{(?:"[A-Za-z]++":' + scalar + rb")?\}\}"
    attribute = rb'(?>\{"key":(?:' + b"|".join([*needed, other]) + rb"))"
    return re.compile(rb"\[(?:" + attribute + rb"(?:,|(?=\])))*+\]|null")


_COMPACT_LIST_RES = (_compact_list_re(rb'"[^"]*+"'), _compact_list_re(_STR))
"""For lines without and with a backslash (the first is faster: no escapes to skip). A
group in a repeat keeps its last capture, so a key given twice reads as in a dict; the
possessive repeat and atomic attributes keep a failed match from backtracking."""


def _compact_values(listed: msgspec.Raw | None, pattern: re.Pattern[bytes]) -> tuple | None:
    """`_log_values` of an attribute list that holds only compact scalar attributes: those
    are the lists the general path reads with `_LOG_ATTR_RE`, so the raw values are the
    same. One regex match, no Python per attribute; None for any other list."""
    if listed is None:
        return _NO_VALUES
    match = pattern.fullmatch(listed)
    return None if match is None else match.groups()


_NO_VALUES = (None,) * len(_LOG_KEYS)


def _msgspec_logs(raw: bytes, resources: dict[bytes, Any]
                  ) -> tuple[list[tuple], list[str]] | None:
    """Rows and ignored event names of a line of log records, by `_log_row` on the same
    attribute values as the general path; None sends the line to the general path: one
    that is not a well-formed logs line (msgspec checks the JSON and the structure), has an
    attribute list in another layout, or holds a record that is skipped. `resources`
    caches the attributes of resources seen before (lines repeat them)."""
    try:
        doc = _LOGS_DECODER.decode(raw)
    except msgspec.DecodeError:  # ValidationError included
        return None
    pattern = _COMPACT_LIST_RES[_BACKSLASH in raw]
    rows: list[tuple] = []
    names: list[str] = []
    try:
        for resource in doc.resourceLogs:
            listed = None if resource.resource is None else resource.resource.attributes
            key = b"" if listed is None else bytes(listed)
            res = resources.get(key)
            if res is None:
                res = _compact_values(listed, pattern)
                if res is None:
                    return None
                if len(resources) >= _MAX_RESOURCES:
                    resources.clear()
                resources[key] = res
            for scope in resource.scopeLogs or ():
                for rec in scope.logRecords or ():
                    values = _compact_values(rec.attributes, pattern)
                    if values is None:
                        return None
                    out = _log_row(rec.body, rec.timeUnixNano, rec.observedTimeUnixNano,
                                   values, res)
                    (names if type(out) is str else rows).append(out)
    except _Skip:
        return None
    return rows, names


_MAX_RESOURCES = 4096
"""Distinct resource attribute lists `_msgspec_logs` keeps (an export has a few)."""


# ----------------------------------------------------------------------------- metrics


class _Point(NamedTuple):
    """One `claude_code.token.usage` data point, before cumulative values become deltas."""

    series: tuple
    temporality: str
    start_ns: int
    time_ns: int
    value: int
    column: str
    session_id: str | None
    model: str | None


def _temporality(value: Any) -> str:
    """OTLP AggregationTemporality (1 = delta, 2 = cumulative; enum names in some exports)."""
    text = str(value).upper()
    if text in ("1", "AGGREGATION_TEMPORALITY_DELTA", "DELTA"):
        return "delta"
    if text in ("2", "AGGREGATION_TEMPORALITY_CUMULATIVE", "CUMULATIVE"):
        return "cumulative"
    raise _Skip(f"aggregationTemporality missing or unknown: {value!r}")


def _point(point: Any, resource: Mapping[bytes, Any], temporality: str, raw: bytes,
           spans: list[tuple[int, int]]) -> _Point:
    """Validate one data point of the token.usage sum."""
    attrs = {**_py_attrs(resource),
             **_py_attrs(_attrs(_dict_get(point, "attributes", "data point"), raw, spans))}
    column = METRIC_TYPES.get(str(attrs.get("type")))
    if column is None:
        raise _Skip(f"token type {attrs.get('type')!r} is not one of {sorted(METRIC_TYPES)}")
    value = _count(point.get("asInt", point.get("asDouble")), "token.usage value")
    if value is None:
        raise _Skip("data point without asInt/asDouble")
    time_s = _nanos_to_s(point.get("timeUnixNano"))
    if time_s is None:
        raise _Skip("data point without timeUnixNano")
    start_ns = int(point["startTimeUnixNano"]) if _nanos_to_s(
        point.get("startTimeUnixNano")) else 0  # validated first: garbage is a skip
    series = tuple(sorted((k, str(v)) for k, v in attrs.items()))
    return _Point(series, temporality, start_ns, int(point["timeUnixNano"]), value, column,
                  _text(attrs.get("session.id")), _text(attrs.get("model")))


def _deltas(points: Sequence[_Point]) -> list[tuple[_Point, int]]:
    """Per series, cumulative values to deltas; a drop or a new start time is a reset."""
    by_series: dict[tuple, list[_Point]] = defaultdict(list)
    for p in points:
        by_series[(p.series, p.temporality)].append(p)
    out: list[tuple[_Point, int]] = []
    for (_, temporality), series in by_series.items():
        if temporality == "delta":
            out.extend((p, p.value) for p in series)
            continue
        series.sort(key=lambda p: (p.time_ns, p.value))
        previous: _Point | None = None
        for p in series:
            restarted = previous is not None and p.start_ns and previous.start_ns and \
                p.start_ns != previous.start_ns
            reset = previous is None or p.value < previous.value or restarted
            out.append((p, p.value if reset else p.value - previous.value))
            previous = p
    return out


def _metric_rows(points: Sequence[_Point]) -> list[tuple]:
    """Deltas summed per (time, session, model): one frame row per export interval."""
    sums: dict[tuple, dict[str, int]] = defaultdict(lambda: dict.fromkeys(TOKEN_COLUMNS, 0))
    for p, delta in _deltas(points):
        sums[(p.time_ns, p.session_id, p.model)][p.column] += delta
    return [(t / 1e9, session, model, *(c[k] for k in TOKEN_COLUMNS), "otlp-metrics")
            for (t, session, model), c in sorted(sums.items(), key=lambda kv: kv[0][0])]


# ----------------------------------------------------------------------------- flat records

_LOGFMT_RE = re.compile(r'([^\s=]+)=("(?:[^"\\]|\\.)*"|\S*)')
_TIME_FIELDS = ("timestamp_s", "event_timestamp", "timestamp", "time", "_time")
_NAME_FIELDS = ("body", "msg", "message", "event")


def _norm_key(key: str) -> str:
    """Field names as Loki/Grafana/CSV spell them, reduced to one form (`session.id`,
    `attributes_session_id` and `Session_ID` all become `session_id`)."""
    name = str(key).strip().lower().replace(".", "_").replace("-", "_")
    for prefix in ("attributes_", "attribute_", "resources_", "resource_"):
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix):]
    return name


def _normalize(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {_norm_key(k): v for k, v in fields.items()}


def _flatten_json(record: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON log line: top-level fields plus nested maps (`attributes`, `resources`), the
    record's own attributes taking precedence over resource attributes."""
    nested = [v for k, v in record.items() if isinstance(v, dict) and "attribute" not in k]
    attrs = [v for k, v in record.items() if isinstance(v, dict) and "attribute" in k]
    out: dict[str, Any] = {}
    for part in nested:
        out.update(_normalize(part))
    out.update({_norm_key(k): v for k, v in record.items() if not isinstance(v, dict)})
    for part in attrs:
        out.update(_normalize(part))
    return out


def _parse_line(line: Any) -> dict[str, Any]:
    """One Loki log line: a JSON record, logfmt, or the bare body (the event name)."""
    if not isinstance(line, str):
        raise _Skip(f"Loki log line is not text: {type(line).__name__}")
    text = line.strip()
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except ValueError:
            raise _Skip("log line starts with '{' but is not valid JSON") from None
        if not isinstance(record, dict):
            raise _Skip("JSON log line is not an object")
        return _flatten_json(record)
    out: dict[str, Any] = {}
    first = text.split(maxsplit=1)[0] if text else ""
    if first and "=" not in first:
        out["body"] = first
    for key, value in _LOGFMT_RE.findall(text):
        if value.startswith('"'):
            try:
                value = json.loads(value)
            except ValueError:
                value = value[1:-1]
        out[_norm_key(key)] = value
    return out


def _flat_event_name(fields: Mapping[str, Any]) -> str | None:
    name = _text(fields.get("event_name"))
    if name:
        return _canonical_event(name)
    for key in _NAME_FIELDS:
        value = _text(fields.get(key))
        if value and value.startswith("claude_code."):
            return value
    return None


def _flat_time_s(fields: Mapping[str, Any]) -> float | None:
    for key in _TIME_FIELDS:
        if fields.get(key) not in (None, ""):
            return _any_time_to_s(fields[key])
    return None


# ----------------------------------------------------------------------------- the reader


@dataclass(frozen=True)
class ClaudeCodeTelemetry:
    """Token counts read from an export, and an account of everything not used.

    `frame`: one row per api_request event (or per metric export interval, session and model
    when read from `claude_code.token.usage`), columns `FRAME_DTYPES`. `skipped`: unusable
    records (`SKIP_COLUMNS`). `ignored`: other events and metrics by name. `set_aside`: rows of
    the signal not used (`signal="auto"` uses the log events when there are any, since logs
    and metrics count the same tokens twice).
    """

    frame: pd.DataFrame
    skipped: pd.DataFrame
    ignored: dict[str, int]
    set_aside: dict[str, int]
    paths: tuple[Path, ...]
    signal: str

    def skip_counts(self) -> pd.Series:
        """Skipped records per reason, most frequent first."""
        return self.skipped.reason.value_counts()

    def report(self) -> str:
        """A few lines for a notebook or log: what was read, skipped, ignored, set aside."""
        names = ", ".join(p.name for p in self.paths)
        lines = [f"{len(self.frame):,} rows from {names} (signal: {self.signal})",
                 f"skipped {len(self.skipped):,} record(s)"]
        lines += [f"  {n:,} x {reason}" for reason, n in self.skip_counts().items()]
        if self.ignored:
            lines.append("ignored (other events/metrics): " + ", ".join(
                f"{k} {v:,}" for k, v in sorted(self.ignored.items())))
        if self.set_aside:
            lines.append("set aside: " + ", ".join(
                f"{k} {v:,}" for k, v in sorted(self.set_aside.items())))
        return "\n".join(lines)


_AFTER_BARE_CR_RE = re.compile(r"(?<=\r)(?!\n)")
"""The places where a line ends at a CR that no LF follows."""


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


def _open(path: Path) -> IO[bytes]:
    """Open plain or gzip input, recognised by its magic bytes rather than its name. A
    plain file gets a 1 MiB buffer: iterating its lines is then ~3x faster than with 8 KiB."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb", 1 << 20)


def _head(path: Path, size: int) -> bytes:
    """The first `size` bytes (decompressed), or as many as a truncated gzip file holds."""
    chunks, total = [], 0
    with _open(path) as fh:
        try:
            while total < size and (chunk := fh.read(min(8192, size - total))):
                chunks.append(chunk)
                total += len(chunk)
        except (EOFError, OSError, zlib.error):
            pass  # sniff what could be read; reading the file then reports where it ends
    return b"".join(chunks)


def _sniff(path: Path) -> str:
    """Guess the format from the first 64 KiB: OTLP, Loki response or CSV."""
    head = _head(path, 65_536)
    if not head.strip():
        raise NoUsableRecordsError(f"{path}: the file is empty")
    if any(k in head for k in (b'"resourceLogs"', b'"resourceMetrics"', b'"resourceSpans"')):
        return "otlp"  # checked first: a corrupted first byte must not make it a CSV
    if head.lstrip()[:1] not in (b"{", b"["):
        return "csv"
    return "loki" if any(k in head for k in (b'"result"', b'"streams"', b'"values"')) else "otlp"


class _Reader:
    """Accumulates rows, metric points, skips and ignored counts across files."""

    def __init__(self, strict: bool, max_line_bytes: int = MAX_LINE_BYTES):
        self.strict = strict
        self.max_line_bytes = max_line_bytes
        self.rows: list[tuple] = []
        self.points: list[_Point] = []
        self.skipped: list[tuple[str, int | None, str, str]] = []
        self.ignored: Counter[str] = Counter()
        self.file = ""
        self.resources: dict[bytes, Any] = {}
        """Resource attributes by their raw JSON (`_msgspec_logs`)."""

    def skip(self, line: int | None, record: str, reason: str) -> None:
        if self.strict:
            where = f" ({record})" if record else ""
            at = "" if line is None else f":{line}"  # None: where a gzip stream broke
            raise TelemetryFormatError(f"{self.file}{at}: {reason}{where}")
        self.skipped.append((self.file, line, record, reason))

    def too_long(self, line: int) -> None:
        """A line over `max_line_bytes`; strict, the error is `line_too_long`'s message."""
        message = line_too_long(self.file, line, self.max_line_bytes)
        self.skip(line, "", message.removeprefix(f"{self.file}:{line}: "))

    def json_documents(self, fh: IO[bytes]) -> Iterator[tuple[int, bytes]]:
        """(line, raw JSON) of each non-blank line, or of the whole file when it is one
        document spread over lines (pretty-printed). Why this shape: a first line that is
        not JSON may open such a document, so lines are gathered up to `max_line_bytes` in
        all; a file that ends there and parses whole is one document (line 1), else its
        lines are read one by one. A start over the bound that holds no JSON object line
        is taken for a document too big to read (one skip naming the limit), otherwise
        for JSON lines whose first line is cut, streamed on."""
        lines = bounded_lines(fh, self.max_line_bytes)
        first = next(lines, None)
        if first is None:
            return
        head = [first]
        if first[1] is not None and first[1].strip() and not _is_json(first[1]):
            if not self.gather_head(head, lines):
                return
        for line_no, raw in chain(head, lines):
            if raw is None:
                self.too_long(line_no)
            elif not raw.isspace():  # raw.strip() without copying the line
                yield line_no, raw

    def gather_head(self, head: list[tuple[int, bytes | None]],
                    lines: Iterator[tuple[int, bytes | None]]) -> bool:
        """Extend `head` (the first line) up to `max_line_bytes`; True when its lines are to
        be read one by one, False when it was one document, handled (read or skipped)."""
        size = len(head[0][1] or b"")
        for item in lines:
            head.append(item)
            if item[1] is None or (size := size + len(item[1])) > self.max_line_bytes:
                break
        else:  # the file ended within the bound: one document, or lines?
            whole = b"".join(raw or b"" for _, raw in head)
            if _is_json(whole):
                head[:] = [(1, whole)]
            return True
        if any(raw is not None and raw.lstrip()[:1] == b"{" and _is_json(raw)
               for _, raw in head[1:]):
            return True
        self.skip(1, "", f"the first line is not JSON and the first {size:,} bytes hold no "
                  "JSON line: one document (pretty-printed?) longer than "
                  f"{self.max_line_bytes:,} bytes (the reader's max_line_bytes limit); "
                  "export JSON lines or raise max_line_bytes")
        return False

    def accept(self, outcome: tuple | str) -> None:
        """Add a row, or count an event that is not an api_request."""
        if type(outcome) is str:
            self.ignored[outcome] += 1
        else:
            self.rows.append(outcome)

    # -- OTLP ---------------------------------------------------------------------------

    def read_otlp(self, fh: IO[bytes]) -> None:
        for line_no, raw in self.json_documents(fh):
            self.otlp_document(raw, line_no)

    def otlp_document(self, raw: bytes, line: int) -> None:
        if not raw.isascii():  # checked here: the fast path never decodes most of the line
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                self.skip(line, "", _invalid_json(exc))
                return
        fast = _msgspec_logs(raw, self.resources)
        if fast is not None:
            self.rows += fast[0]
            if fast[1]:
                self.ignored.update(fast[1])
            return
        reduced, spans = _reduce_attribute_lists(raw)
        try:  # decoded here, not by json.loads, which would guess UTF-16 from a NUL byte
            doc = json.loads(reduced.decode("utf-8"))
        except ValueError as exc:
            self.skip(line, "", _invalid_json(exc))
            return
        if not isinstance(doc, dict) or not {"resourceLogs", "resourceMetrics",
                                             "resourceSpans"} & doc.keys():
            self.skip(line, "", "not an OTLP export (no resourceLogs/resourceMetrics)")
            return
        if "resourceSpans" in doc:
            self.ignored["(trace spans)"] += 1
        self.otlp_walk(doc.get("resourceLogs"), "scopeLogs", "logRecords", raw, spans, line)
        self.otlp_walk(doc.get("resourceMetrics"), "scopeMetrics", "metrics", raw, spans, line)

    def otlp_walk(self, resources: Any, scope_key: str, item_key: str, raw: bytes,
                  spans: list[tuple[int, int]], line: int) -> None:
        """Visit every log record / metric with its resource's attributes."""
        if resources is None:
            return
        top = "resourceLogs" if item_key == "logRecords" else "resourceMetrics"
        handle = self.otlp_log if item_key == "logRecords" else self.otlp_metric
        pattern = _LOG_ATTR_RE if item_key == "logRecords" else _ATTR_RE
        try:
            for i, resource in enumerate(_as_list(resources, top)):
                res_attrs = _attrs(_dict_get(_dict_get(resource, "resource", top) or {},
                                             "attributes", "resource"), raw, spans, pattern)
                for j, scope in enumerate(_as_list(resource.get(scope_key), scope_key)):
                    items = _as_list(_dict_get(scope, item_key, scope_key), item_key)
                    for k, item in enumerate(items):
                        where = f"{top}[{i}].{scope_key}[{j}].{item_key}[{k}]"
                        try:
                            handle(item, res_attrs, raw, spans, line, where)
                        except _Skip as exc:
                            self.skip(line, where, str(exc))
        except _Skip as exc:
            self.skip(line, top, f"malformed OTLP structure: {exc}")

    def otlp_log(self, rec: Any, res: Mapping[bytes, Any], raw: bytes,
                 spans: list[tuple[int, int]], line: int, where: str) -> None:
        attrs = _attrs(_dict_get(rec, "attributes", "log record"), raw, spans, _LOG_ATTR_RE)
        self.accept(_log_row(rec.get("body"), rec.get("timeUnixNano"),
                             rec.get("observedTimeUnixNano"), _log_values(attrs),
                             _log_values(res)))

    def otlp_metric(self, metric: Any, res: Mapping[bytes, Any], raw: bytes,
                    spans: list[tuple[int, int]], line: int, where: str) -> None:
        name = _dict_get(metric, "name", "metric")
        if name != TOKEN_METRIC:
            self.ignored[f"metric {name}"] += 1
            return
        data = metric.get("sum")
        if not isinstance(data, dict):
            raise _Skip(f"{TOKEN_METRIC} has no 'sum' (expected a counter)")
        temporality = _temporality(data.get("aggregationTemporality"))
        for n, point in enumerate(_as_list(data.get("dataPoints"), "dataPoints")):
            try:
                self.points.append(_point(point, res, temporality, raw, spans))
            except _Skip as exc:
                self.skip(line, f"{where}.dataPoints[{n}]", str(exc))

    # -- Loki and CSV -------------------------------------------------------------------

    def read_loki(self, fh: IO[bytes]) -> None:
        """One query response, or JSON lines of them (paged exports)."""
        for line_no, raw in self.json_documents(fh):
            try:
                doc = json.loads(raw.decode("utf-8"))
            except ValueError as exc:  # UnicodeDecodeError included
                self.skip(line_no, "", _invalid_json(exc))
                continue
            self.loki_document(doc, line_no)

    def loki_document(self, doc: Any, line: int) -> None:
        data = doc.get("data", doc) if isinstance(doc, dict) else {"result": doc}
        streams = data.get("result", data.get("streams")) if isinstance(data, dict) else None
        if not isinstance(streams, list):
            self.skip(line, "", "not a Loki query response (no data.result list)")
            return
        if isinstance(data, dict) and data.get("resultType") in ("matrix", "vector"):
            self.skip(line, "", "Loki metric query result, not log lines")
            return
        for i, stream in enumerate(streams):
            labels = stream.get("stream", {}) if isinstance(stream, dict) else None
            values = stream.get("values") if isinstance(stream, dict) else None
            if not isinstance(labels, dict) or not isinstance(values, list):
                self.skip(line, f"result[{i}]", "stream without 'stream' labels and 'values'")
                continue
            labels = _normalize(labels)
            for j, entry in enumerate(values):
                try:
                    self.loki_entry(labels, entry)
                except _Skip as exc:
                    self.skip(line, f"result[{i}].values[{j}]", str(exc))

    def loki_entry(self, labels: dict[str, Any], entry: Any) -> None:
        if not isinstance(entry, list) or len(entry) < 2:
            raise _Skip("Loki value is not [timestamp, line]")
        fields = dict(labels)
        if len(entry) > 2 and isinstance(entry[2], dict):  # structured metadata / parsed
            for part in entry[2].values():
                fields.update(_normalize(part) if isinstance(part, dict) else {})
            fields.update(_normalize({k: v for k, v in entry[2].items()
                                      if not isinstance(v, dict)}))
        fields.update(_parse_line(entry[1]))
        self.flat_event(fields, _nanos_to_s(entry[0]), "loki")

    def csv_lines(self, fh: IO[bytes], undecodable: list[bool]) -> Iterator[str]:
        """The file's lines as text for `csv.reader`, read with the bound. A line that is not
        UTF-8 keeps its bad bytes as lone surrogates (its rows are skipped) and sets
        `undecodable[0]`; a line over the bound is skipped here and passed on as an empty
        line, so that `csv.reader.line_num` stays the file's line number. A bare CR ends a
        line too (old Mac files), as in a text file opened with newline=""."""
        for line_no, raw in bounded_lines(fh, self.max_line_bytes):
            if raw is None:
                self.too_long(line_no)
                yield "\n"
                continue
            codec = "utf-8-sig" if line_no == 1 else "utf-8"
            try:
                text = raw.decode(codec)
            except UnicodeDecodeError:
                undecodable[0] = True
                text = raw.decode(codec, "surrogateescape")
            if "\r" in text:  # a bare CR anywhere ends a line ("\r\x00": two lines)
                yield from filter(None, _AFTER_BARE_CR_RE.split(text))
            else:
                yield text

    def read_csv(self, fh: IO[bytes]) -> None:
        flag = [False]  # set by csv_lines once a line is not UTF-8
        reader = csv.reader(self.csv_lines(fh, flag))
        header = next(reader, None)
        keys = [_norm_key(h) for h in header or []]
        if not set(TOKEN_COLUMNS) & set(keys):
            self.skip(1, "", f"CSV header has no token column (expected {list(TOKEN_COLUMNS)})")
            return
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(keys):
                self.skip(reader.line_num, "", f"row has {len(row)} fields, header {len(keys)}")
                continue
            bad = flag[0] and next(((k, found) for k, cell in zip(keys, row, strict=True)
                                        if (found := UNDECODABLE_RE.search(cell))), None)
            if bad:
                self.skip(reader.line_num, "", f"not UTF-8 text (byte "
                          f"0x{ord(bad[1].group()) - 0xDC00:02x} in field {bad[0]!r})")
                continue
            try:
                self.flat_event({k: v for k, v in zip(keys, row, strict=True) if v != ""},
                                None, "csv")
            except _Skip as exc:
                self.skip(reader.line_num, "", str(exc))

    def flat_event(self, fields: Mapping[str, Any], time_s: float | None, source: str) -> None:
        """One event from flat fields (Loki, CSV): api_request rows in, others counted."""
        name = _flat_event_name(fields)
        if name != API_REQUEST:
            if name is not None or not any(fields.get(c) is not None for c in TOKEN_COLUMNS):
                self.ignored[name or "(unnamed log record)"] += 1
                return
        time_s = time_s if time_s is not None else _flat_time_s(fields)
        self.accept(_row(time_s, fields.get("session_id"), fields.get("model"),
                         [fields.get(c) for c in TOKEN_COLUMNS], source))


def _frame(rows: list[tuple]) -> pd.DataFrame:
    """The rows as columns of `FRAME_DTYPES`, built column by column (text stays Python str
    and None in object columns: no inference of pandas' string dtype and back)."""
    columns = list(zip(*rows, strict=True)) or [()] * len(FRAME_DTYPES)
    return pd.DataFrame({name: pd.Series(np.array(column, dtype=dtype), dtype=dtype, copy=False)
                         for (name, dtype), column in zip(FRAME_DTYPES.items(), columns,
                                                          strict=True)})


def _read_one(reader: _Reader, path: Path, fmt: ExportFormat) -> None:
    """Read one file into `reader`; raise if it contributed nothing usable."""
    kind = _sniff(path) if fmt == "auto" else fmt
    if kind not in ("otlp", "loki", "csv"):
        raise ValueError(f"unknown export format {fmt!r}; use auto, otlp, loki or csv")
    reader.file = str(path)
    before = (len(reader.rows), len(reader.points), len(reader.skipped),
              sum(reader.ignored.values()))
    try:
        with _open(path) as fh:
            getattr(reader, f"read_{kind}")(fh)
    except (EOFError, OSError, zlib.error) as exc:  # a truncated or corrupted gzip file
        reader.skip(None, "", f"unreadable after this point ({exc}); truncated file?")
    if (len(reader.rows), len(reader.points)) == before[:2]:
        reasons = Counter(s[3] for s in reader.skipped[before[2]:]).most_common(3)
        seen = sum(reader.ignored.values()) - before[3]
        raise NoUsableRecordsError(
            f"{path}: no usable {API_REQUEST} event or {TOKEN_METRIC} point "
            f"(read as {kind}; skipped: {reasons or 'none'}; other events/metrics: {seen})")


def read_claude_code(paths: str | Path | Iterable[str | Path], *, fmt: ExportFormat = "auto",
                     signal: Signal = "auto", strict: bool = False,
                     max_line_bytes: int = MAX_LINE_BYTES) -> ClaudeCodeTelemetry:
    """Read Claude Code telemetry exports (OTLP JSON lines, Loki response or CSV; gzip ok).

    `signal` picks which counts make the frame: "logs" (api_request events), "metrics"
    (token.usage), "both" (summed: only for exports where each signal covers different
    traffic), or "auto": logs when there are any, else metrics. Raises
    `NoUsableRecordsError` naming a file with nothing usable, and with `strict=True`
    `TelemetryFormatError` at the first unusable record. `max_line_bytes` bounds a line
    (and a document spread over lines); a longer one is such an unusable record.
    """
    path_list = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
    if not path_list:
        raise ValueError("no export file given")
    if signal not in ("auto", "logs", "metrics", "both"):
        raise ValueError(f"unknown signal {signal!r}; use auto, logs, metrics or both")
    if isinstance(max_line_bytes, bool) or not isinstance(max_line_bytes, int) \
            or max_line_bytes < 1:
        raise ValueError(f"max_line_bytes must be an integer >= 1, got {max_line_bytes!r}")
    reader = _Reader(strict, max_line_bytes)
    for path in path_list:
        _read_one(reader, path, fmt)
    metric_rows = _metric_rows(reader.points)
    chosen = signal if signal != "auto" else ("logs" if reader.rows else "metrics")
    rows = {"logs": reader.rows, "metrics": metric_rows,
            "both": reader.rows + metric_rows}[chosen]
    set_aside = {"logs": {"token.usage rows": len(metric_rows)},
                 "metrics": {"api_request rows": len(reader.rows)}, "both": {}}[chosen]
    skipped = pd.DataFrame(reader.skipped, columns=SKIP_COLUMNS)
    return ClaudeCodeTelemetry(_frame(rows), skipped, dict(reader.ignored),
                               {k: v for k, v in set_aside.items() if v}, tuple(path_list),
                               chosen)


# ----------------------------------------------------------------------------- token mix

_BY_ALIASES = {"session": "session_id", "day": "day", "model": "model"}


def _group_columns(df: pd.DataFrame, by: str | Sequence[str] | None) -> tuple[pd.DataFrame,
                                                                            list[str]]:
    """Resolve `by` to columns, deriving `day` (UTC date of timestamp_s) when asked for."""
    names = [] if by is None else [by] if isinstance(by, str) else list(by)
    columns = [_BY_ALIASES.get(name, name) for name in names]
    if "day" in columns and "day" not in df.columns:
        when = pd.to_datetime(df.timestamp_s, unit="s", utc=True)
        df = df.assign(day=when.dt.strftime("%Y-%m-%d").fillna("unknown"))
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise KeyError(f"token_mix: cannot group by {missing}; columns are {list(df.columns)}")
    return df, columns


def token_mix(df: pd.DataFrame, by: str | Sequence[str] | None = None) -> pd.DataFrame:
    """Tokens by type and their share of all tokens in percent, as in figure A1.

    Types (in the study's order): cache_read, cache_creation, output, input (uncached input).
    `by`: None (overall), "model", "session", "day" (UTC), another column, or a list of them.
    Returns a tidy frame: the group columns, `token_type`, `tokens`, `share_pct` (NaN for a
    group without tokens).
    """
    df, columns = _group_columns(df, by)
    value_columns = list(MIX_TYPES.values())
    if columns:
        totals = df.groupby(columns, dropna=False, sort=True)[value_columns].sum().reset_index()
    else:
        totals = df[value_columns].sum().to_frame().T
    long = totals.rename(columns={v: k for k, v in MIX_TYPES.items()}).melt(
        id_vars=columns, value_vars=list(MIX_TYPES), var_name="token_type", value_name="tokens")
    long["tokens"] = long.tokens.astype("int64")
    if columns:
        group_total = long.groupby(columns, dropna=False).tokens.transform("sum")
    else:
        group_total = pd.Series(long.tokens.sum(), index=long.index)
    long["share_pct"] = (long.tokens / group_total * 100).where(group_total > 0)
    rank = long.token_type.map({name: i for i, name in enumerate(MIX_TYPES)})
    order = long.assign(_rank=rank).sort_values([*columns, "_rank"], kind="stable")
    return order.drop(columns="_rank").reset_index(drop=True)


def mix_shares(mix: pd.DataFrame) -> dict[str, float]:
    """Overall shares in percent by token type, from `token_mix(df)` without `by`."""
    if len(mix) != len(MIX_TYPES):
        raise ValueError("mix_shares expects the overall mix (token_mix without `by`)")
    return {str(k): float(v) for k, v in zip(mix.token_type, mix.share_pct, strict=True)}
