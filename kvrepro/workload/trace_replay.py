"""Replay of block-hash request traces (Mooncake, Qwen-Bailian) as a `Workload`.

Block-hash traces publish no text, only each request's length and the hash ids of its
prompt's fixed-size token blocks: equal ids mean equal blocks (a reusable KV prefix). To make a
live engine see the same prefix sharing, `BlockHashTokens` turns every hash id into a fixed
block of token ids, a pure function of (seed, hash id), so two requests that share k leading
hash ids share exactly k blocks of token ids.

Formats (one JSON object per line, plain or gzip):

* Mooncake (FAST'25 release): `timestamp` (ms), `input_length`, `output_length`, `hash_ids`;
  512-token blocks.
* Qwen-Bailian (alibaba-edu/qwen-bailian-usagetraces-anon): `chat_id`, `parent_chat_id` (-1 for
  a conversation's first request), `timestamp` (s), `input_length`, `output_length`, `type`,
  `turn`, `hash_ids`; 16-token blocks.

Readers return a `ReadResult`: a tidy frame (`arrival_s`, `input_length`, `output_length`,
`hash_ids` as tuples of int, `line`, plus `chat_id`, `parent_chat_id`, `trace_turn`,
`request_type` for Qwen-Bailian) and the lines skipped with `strict=False` (a line that is not
UTF-8 is one of them: lines are decoded one at a time). Lines are read with a bound,
`max_line_bytes` (default `kvrepro._lines.MAX_LINE_BYTES`): a longer line (a cut file, one
without newlines) is never held whole; it is an error naming file, line and limit, or with
`strict=False` a skipped line.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import pandas as pd

from kvrepro._checks import not_utf8
from kvrepro._lines import MAX_LINE_BYTES, bounded_lines, line_too_long
from kvrepro.workload.base import (
    SESSION_COLUMNS,
    TOKEN_SOURCES,
    TURN_COLUMNS,
    Workload,
    turn_value,
)

MOONCAKE_BLOCK_TOKENS = 512
QWEN_BAILIAN_BLOCK_TOKENS = 16
TraceFormat = Literal["mooncake", "qwen_bailian"]
_OUTPUT_KEY = int.from_bytes(b"output", "big")
"""Third seed word of output ids, so they never reuse a block's generator stream."""


# --------------------------------------------------------------------------- reading helpers


@dataclass(frozen=True)
class ReadResult:
    """A parsed input file: its rows, and which lines were skipped and why (`strict=False`)."""

    frame: pd.DataFrame
    skipped: pd.DataFrame
    path: Path
    file_format: str
    block_size: int | None = None

    @property
    def n_skipped(self) -> int:
        """How many lines (or entries) were left out because they were malformed."""
        return len(self.skipped)


class Problems:
    """Collects what is wrong with an input file, naming the file and 1-based line.

    With `strict=True` the first problem raises ValueError("file:line: reason"); otherwise
    problems are recorded and returned as the `skipped` table of a `ReadResult`.
    """

    def __init__(self, path: Path, strict: bool) -> None:
        self.path, self.strict = path, strict
        self.rows: list[tuple[int, str]] = []

    def add(self, line: int, reason: str) -> None:
        """Raise (strict) or record one bad line."""
        if self.strict:
            raise ValueError(f"{self.path}:{line}: {reason}")
        self.rows.append((line, reason))

    def too_long(self, line: int, max_line_bytes: int) -> None:
        """A line over the reader's limit; strict, the error is `line_too_long`'s message."""
        message = line_too_long(self.path, line, max_line_bytes)
        self.add(line, message.removeprefix(f"{self.path}:{line}: "))

    def frame(self) -> pd.DataFrame:
        """The skipped lines as a table with columns `line` and `reason`."""
        return pd.DataFrame(self.rows, columns=["line", "reason"]).astype(
            {"line": "int64", "reason": "object"})


def open_bytes(path: Path) -> IO[bytes]:
    """Open a file for reading bytes, transparently decompressing `.gz`."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")


def _json_lines(path: Path, problems: Problems,
                max_line_bytes: int) -> Iterator[tuple[int, Any]]:
    """Yield (line number, parsed object) for each non-blank line; a line that is not UTF-8,
    not JSON or longer than `max_line_bytes` goes to problems. Lines are decoded one by one
    (a text-mode file decodes in chunks, so one bad byte would end the file at an earlier
    line), and read with a bound, so one huge line costs at most the bound in memory."""
    line_no = 0
    try:
        with open_bytes(path) as handle:
            for line_no, raw in bounded_lines(handle, max_line_bytes):
                if raw is None:
                    problems.too_long(line_no, max_line_bytes)
                    continue
                if not raw.strip():
                    continue
                try:
                    yield line_no, json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError as err:
                    problems.add(line_no, f"{not_utf8(err)[1]}; corrupted line?")
                except json.JSONDecodeError as err:
                    problems.add(line_no, f"malformed JSON ({err.msg} at column {err.colno}); "
                                          "truncated or corrupted line?")
    except (EOFError, OSError, zlib.error) as err:
        problems.add(line_no + 1, f"unreadable after this point ({err}); truncated file?")


# --------------------------------------------------------------------------- record checks


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


_FIELD_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "timestamp": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "input_length": (lambda v: _is_int(v) and v > 0, "an integer > 0"),
    "output_length": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "hash_ids": (lambda v: isinstance(v, list) and len(v) > 0
                 and all(_is_int(h) and h >= 0 for h in v), "a non-empty list of integers >= 0"),
    "chat_id": (_is_int, "an integer"),
    "parent_chat_id": (lambda v: _is_int(v) and v >= -1, "an integer >= -1"),
    "turn": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "type": (lambda v: isinstance(v, str), "a string"),
}
_FIELDS: dict[str, tuple[str, ...]] = {
    "mooncake": ("timestamp", "input_length", "output_length", "hash_ids"),
    "qwen_bailian": ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length",
                     "type", "turn", "hash_ids"),
}


def _record_problem(record: Any, fields: tuple[str, ...], block_size: int) -> str | None:
    """Why one trace record is unusable, or None when it is fine (see `read_mooncake_trace`
    for the block-count rule)."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    for name in fields:
        if name not in record:
            return f"missing field {name!r}"
        check, wanted = _FIELD_CHECKS[name]
        if not check(record[name]):
            return f"field {name!r} must be {wanted}, got {str(record[name])[:60]}"
    n_blocks = -(-record["input_length"] // block_size)
    if n_blocks != len(record["hash_ids"]):
        return (f"input_length {record['input_length']} needs {n_blocks} blocks of {block_size} "
                f"tokens but hash_ids has {len(record['hash_ids'])}")
    return None


def _read_block_trace(path: str | Path, trace_format: TraceFormat, block_size: int,
                      strict: bool, max_line_bytes: int) -> ReadResult:
    """Parse and check a block-hash trace; shared by both formats."""
    src = Path(path)
    if not src.is_file():
        raise FileNotFoundError(f"trace file not found: {src}")
    if not _is_int(max_line_bytes) or max_line_bytes < 1:
        raise ValueError(f"max_line_bytes must be an integer >= 1, got {max_line_bytes!r}")
    problems, fields = Problems(src, strict), _FIELDS[trace_format]
    records, lines = [], []
    for line_no, record in _json_lines(src, problems, max_line_bytes):
        reason = _record_problem(record, fields, block_size)
        if reason is not None:
            problems.add(line_no, reason)
            continue
        records.append({name: record[name] for name in fields})
        lines.append(line_no)
    frame = _tidy(pd.DataFrame.from_records(records, columns=list(fields)), trace_format, lines)
    return ReadResult(frame, problems.frame(), src, trace_format, block_size)


def _tidy(raw: pd.DataFrame, trace_format: TraceFormat, lines: list[int]) -> pd.DataFrame:
    """Rename to the package's columns, with units in the names."""
    seconds_per_unit = 1e-3 if trace_format == "mooncake" else 1.0
    frame = pd.DataFrame({
        "arrival_s": raw["timestamp"].astype("float64") * seconds_per_unit,
        "input_length": raw["input_length"].astype("int64"),
        "output_length": raw["output_length"].astype("int64"),
        "hash_ids": pd.Series([tuple(ids) for ids in raw["hash_ids"]], dtype=object),
        "line": pd.Series(lines, dtype="int64"),
    })
    if trace_format == "qwen_bailian":
        frame["chat_id"] = raw["chat_id"].astype("int64")
        frame["parent_chat_id"] = raw["parent_chat_id"].astype("int64")
        frame["trace_turn"] = raw["turn"].astype("int64")
        frame["request_type"] = raw["type"].astype(object)
    return frame


def read_mooncake_trace(path: str | Path, *, strict: bool = True,
                        block_size: int = MOONCAKE_BLOCK_TOKENS,
                        max_line_bytes: int = MAX_LINE_BYTES) -> ReadResult:
    """Read a Mooncake trace (JSON Lines, optionally .gz); timestamps (ms) become `arrival_s`.

    A malformed, truncated or inconsistent line raises ValueError("file:line: reason", naming
    the field when one is missing or wrong); with `strict=False` it is skipped and listed in
    `ReadResult.skipped`, and the valid lines are returned. A line longer than
    `max_line_bytes` (newline not counted) is such a line; it is read past, never held whole.

    The block-count check is exact: ceil(input_length / block_size) == len(hash_ids), no
    tolerance. Every line of the real Mooncake conversation (12,031 lines) and synthetic
    (3,993) traces satisfies it; there, a hash id always sits at the same block position after
    the same predecessor (prefix hashes), and a partial last block has an id of its own that
    never appears as a full block. A mismatch therefore means a corrupted line or a wrong
    `block_size`, not a quirk of the trace. (Qwen-Bailian hashes its padded last block, so
    that block's id changes once output fills it: ids change, counts do not; the same rule
    applies there.)
    """
    return _read_block_trace(path, "mooncake", block_size, strict, max_line_bytes)


def read_qwen_bailian_trace(path: str | Path, *, strict: bool = True,
                            block_size: int = QWEN_BAILIAN_BLOCK_TOKENS,
                            max_line_bytes: int = MAX_LINE_BYTES) -> ReadResult:
    """Read a Qwen-Bailian trace; keeps `chat_id`, `parent_chat_id`, `trace_turn`, `request_type`.

    Errors, `strict` and `max_line_bytes` behave as in `read_mooncake_trace`.
    """
    return _read_block_trace(path, "qwen_bailian", block_size, strict, max_line_bytes)


def read_block_trace(path: str | Path, trace_format: TraceFormat, *, strict: bool = True,
                     block_size: int | None = None,
                     max_line_bytes: int = MAX_LINE_BYTES) -> ReadResult:
    """Read either format by name, with the format's own block size unless one is given."""
    if trace_format not in _FIELDS:
        raise ValueError(f"unknown trace format {trace_format!r} (parameter 'trace_format'); "
                         f"known: {sorted(_FIELDS)}")
    default = MOONCAKE_BLOCK_TOKENS if trace_format == "mooncake" else QWEN_BAILIAN_BLOCK_TOKENS
    return _read_block_trace(path, trace_format, block_size or default, strict,
                             max_line_bytes)


# --------------------------------------------------------------------------- token source


@lru_cache(maxsize=8192)
def _block_ids(seed: int, hash_id: int, block_size: int, vocab_size: int,
               first_id: int) -> np.ndarray:
    """The `block_size` token ids of one hash block (cached: shared prefixes recur a lot)."""
    ids = np.random.default_rng([seed, hash_id]).integers(first_id, vocab_size, size=block_size,
                                                           dtype=np.int64)
    ids[0] = first_id + hash_id % (vocab_size - first_id)
    ids.flags.writeable = False
    return ids


def _as_hash_tuples(values: pd.Series) -> pd.Series:
    """Hash-id sequences as tuples of int: hashable, so `Workload.digest()` can hash them."""
    return pd.Series([tuple(int(h) for h in ids) for ids in values], index=values.index,
                     dtype=object)


@dataclass
class BlockHashTokens:
    """Token ids of block-hash trace requests: each hash id is one fixed block of tokens.

    A block's ids are a pure function of (seed, hash id): drawn from
    `np.random.default_rng([seed, hash_id])` in [first_id, vocab_size), then the first id is
    set to first_id + hash_id mod (vocab_size - first_id). So requests sharing k leading hash
    ids share exactly k * block_size leading token ids, and the next block differs at its first
    token, unless the two next hash ids are congruent modulo (vocab_size - first_id) (31,984
    with the defaults), in which case the shared prefix may run on by chance for a few tokens.

    A prompt is the concatenation of its blocks, the last cut to
    input_length - (n_blocks - 1) * block_size tokens. Output ids are drawn from
    (seed, session_id, "output"). The hash ids come from the `hash_ids` column of `turns`
    (whose values are normalized in place to tuples of int when the source is built: parquet
    returns arrays, which pandas cannot hash for the workload digest).
    """

    seed: int
    block_size: int
    vocab_size: int = 32_000
    first_id: int = 16
    turns: pd.DataFrame | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.vocab_size <= self.first_id:
            raise ValueError("parameters 'block_size' > 0 and 'vocab_size' > 'first_id' needed, "
                             f"got {self.block_size}, {self.vocab_size}, {self.first_id}")
        if self.turns is not None and "hash_ids" in self.turns.columns:
            self.turns["hash_ids"] = _as_hash_tuples(self.turns["hash_ids"])

    def _hash_ids(self, row: pd.Series) -> tuple[int, ...]:
        hashes = turn_value(row, self.turns, "hash_ids", "BlockHashTokens")
        return tuple(int(h) for h in hashes)

    def prompt_from_hashes(self, hash_ids: tuple[int, ...] | list[int],
                           input_length: int) -> np.ndarray:
        """The prompt of `input_length` tokens made of these hash blocks."""
        last = input_length - (len(hash_ids) - 1) * self.block_size
        if not hash_ids or not 0 < last <= self.block_size:
            raise ValueError(f"input_length {input_length} does not fit {len(hash_ids)} blocks "
                             f"of {self.block_size} tokens")
        blocks = [_block_ids(self.seed, int(h), self.block_size, self.vocab_size, self.first_id)
                  for h in hash_ids]
        blocks[-1] = blocks[-1][:last]
        return np.concatenate(blocks)

    def append_ids(self, row: pd.Series) -> np.ndarray:
        """The whole prompt of a trace request (one turn per session: the append is the prompt)."""
        return self.prompt_from_hashes(self._hash_ids(row), int(row.append_tokens))

    def output_ids(self, row: pd.Series) -> np.ndarray:
        """Nominal output ids, seeded by (seed, session_id, "output")."""
        rng = np.random.default_rng([self.seed, int(row.session_id), _OUTPUT_KEY])
        return rng.integers(self.first_id, self.vocab_size, size=int(row.output_tokens),
                            dtype=np.int64)


TOKEN_SOURCES["block_hash"] = BlockHashTokens


# --------------------------------------------------------------------------- workload


_EXTRA_COLUMNS = ("chat_id", "parent_chat_id", "trace_turn", "request_type")


def _trace_turns(requests: pd.DataFrame, time_scale: float) -> pd.DataFrame:
    """One open-loop turn per request: sent at its (scaled) arrival time, never earlier."""
    n = len(requests)
    arrival_s = requests["arrival_s"].to_numpy(dtype="float64") * time_scale
    turns = pd.DataFrame({
        "session_id": np.arange(n, dtype="int64"), "turn": np.zeros(n, dtype="int64"),
        "pause_s": np.zeros(n), "not_before_s": arrival_s,
        "append_tokens": requests["input_length"].to_numpy(dtype="int64"),
        "output_tokens": requests["output_length"].to_numpy(dtype="int64"),
        "prompt_tokens": requests["input_length"].to_numpy(dtype="int64"),
        "is_resume": np.zeros(n, dtype=bool), "append_kind": "trace", "output_kind": "trace",
    }).astype(TURN_COLUMNS)
    turns["hash_ids"] = _as_hash_tuples(requests["hash_ids"].reset_index(drop=True))
    for name in ("line", *_EXTRA_COLUMNS):
        if name in requests.columns:
            turns[name] = requests[name].to_numpy()
    return turns


def trace_to_workload(df: pd.DataFrame | ReadResult, block_size: int | None = None,
                      seed: int = 0, time_scale: float = 1.0, max_requests: int | None = None,
                      vocab_size: int = 32_000, *, source: str | Path | None = None,
                      trace_format: str | None = None) -> Workload:
    """Replay a block-hash trace open loop: each request is a session of one turn.

    `df` is a reader's frame or its `ReadResult` (which supplies block size, source path and
    format). Requests are sent at arrival_s x `time_scale` (0.5 replays twice as fast);
    `max_requests` keeps the earliest ones. `Workload.prompt_ids(session_id, 0)` is the
    request's full prompt; the spec records the trace so save/load round-trips.
    """
    if isinstance(df, ReadResult):
        block_size = block_size or df.block_size
        source, trace_format = source or df.path, trace_format or df.file_format
        df = df.frame
    if not block_size or block_size <= 0 or time_scale <= 0:
        raise ValueError("parameters 'block_size' and 'time_scale' must be > 0, "
                         f"got {block_size!r}, {time_scale!r}")
    requests = df.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    if max_requests is not None:
        requests = requests.iloc[:max_requests]
    turns = _trace_turns(requests, time_scale)
    sessions = pd.DataFrame({
        "session_id": turns.session_id, "arrival_s": turns.not_before_s, "n_turns": 1,
        "cohort": "trace", "is_warmup": False, "end_reason": "trace",
    }).astype(SESSION_COLUMNS)
    tokens_spec = {"kind": "block_hash", "seed": int(seed), "block_size": int(block_size),
                   "vocab_size": int(vocab_size), "first_id": 16}
    spec = {"kind": "trace_replay",
            "trace": {"path": str(source) if source else None, "format": trace_format,
                      "n_requests": len(requests), "time_scale": time_scale,
                      "max_requests": max_requests},
            "tokens": tokens_spec}
    tokens = BlockHashTokens(int(seed), int(block_size), int(vocab_size), turns=turns)
    return Workload(spec, sessions, turns, tokens)
