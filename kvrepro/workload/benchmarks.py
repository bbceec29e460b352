"""Benchmark workloads: the prompt-caching microbenchmark and the multi-turn QPS sweep
(study B runs both: `kvrepro.studies.study_b`).

* `microbenchmark`: a fill round sends every prompt once, then a measure round sends the very
  same prompts again, so the measure round is a 100 % prefix-cache hit and its TTFT is the best
  a tier can do for a cached prefill (figure B6). Each request is its own one-turn session;
  equal `prompt_key` means equal token ids (`KeyedTokens`).
* `macrobenchmark`: multi-turn conversations (ShareGPT file, Azure trace rows grouped into
  conversations, or a synthetic generator of the same shape) scheduled like LMCache's
  multi-round QA benchmark: `num_users` users at once, each sending its next turn
  num_users / qps seconds after its previous one (so the aggregate rate is qps), starting a
  new conversation when one ends (figure B7).

Every random component has its own generator seeded by a list that starts with the spec's
seed; nothing is seeded globally, so the same spec gives the same workload digest.
"""

from __future__ import annotations

import heapq
import io
import json
import math
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvrepro._checks import UNDECODABLE_RE, not_utf8
from kvrepro._lines import MAX_LINE_BYTES, bounded_lines
from kvrepro.workload.base import (
    SESSION_COLUMNS,
    TOKEN_SOURCES,
    TURN_COLUMNS,
    SeededTokens,
    Workload,
    turn_value,
)
from kvrepro.workload.trace_replay import Problems, ReadResult, open_bytes

FIRST_TOKEN_ID = 16
CONVERSATION_COLUMNS: dict[str, str] = {
    "conversation": "int64", "source_id": "object", "turn": "int64",
    "append_tokens": "int64", "output_tokens": "int64",
}
"""Source-independent conversation table: one row per (conversation, turn)."""


# --------------------------------------------------------------------------- microbenchmark


@dataclass
class KeyedTokens:
    """Token ids that depend only on a turn's `prompt_key`: equal keys, identical prompts.

    The append of a turn with key k is drawn from `np.random.default_rng([seed, k])`, its
    nominal output from `[seed, k, 1]`. The key comes from the row (the `prompt_key` column of
    `turns`) or, failing that, from `turns` by (session_id, turn).
    """

    seed: int
    vocab_size: int = 32_000
    first_id: int = FIRST_TOKEN_ID
    turns: pd.DataFrame | None = field(default=None, repr=False)

    def _key(self, row: pd.Series) -> int:
        return int(turn_value(row, self.turns, "prompt_key", "KeyedTokens"))

    def _draw(self, key: list[int], n: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, *key])
        return rng.integers(self.first_id, self.vocab_size, size=n, dtype=np.int64)

    def append_ids(self, row: pd.Series) -> np.ndarray:
        """The prompt of the turn's key, `append_tokens` long."""
        return self._draw([self._key(row)], int(row.append_tokens))

    def output_ids(self, row: pd.Series) -> np.ndarray:
        """A nominal output, also a function of the key only."""
        return self._draw([self._key(row), 1], int(row.output_tokens))


TOKEN_SOURCES["keyed"] = KeyedTokens


class MicrobenchSpec(BaseModel):
    """Parameters of study B's prompt-caching microbenchmark (figure B6)."""

    model_config = ConfigDict(extra="forbid")

    prompt_lengths: list[int] = Field([1024, 4096, 16384, 32768], min_length=1,
                                      description="prompt lengths in tokens (study: 1K-32K)")
    prompts_per_length: int = Field(4, gt=0, description="distinct prompts per length")
    output_tokens: int = Field(1, gt=0, description="tokens generated per request (TTFT only)")
    gap_s: float = Field(2.0, gt=0, description="open-loop spacing between requests")
    round_gap_s: float = Field(10.0, ge=0, description="extra pause between fill and measure")
    seed: int = Field(0, ge=0, description="one seed for all token ids")
    vocab_size: int = Field(32_000, gt=FIRST_TOKEN_ID, description="token ids lie below this")

    @model_validator(mode="after")
    def _lengths_positive(self) -> MicrobenchSpec:
        if any(length <= 0 for length in self.prompt_lengths):
            raise ValueError(f"parameter 'prompt_lengths' must all be > 0, "
                             f"got {self.prompt_lengths}")
        return self


def microbenchmark(spec: MicrobenchSpec | None = None) -> Workload:
    """Fill round, then a measure round of the very same prompts (100 % cache hits).

    Requests are one-turn sessions sent open loop every `gap_s` seconds; the measure round
    starts `round_gap_s` after the fill round's last send, in the same order. Turns carry
    `round` ("fill"/"measure"), `prompt_key` and `prompt_length`; fill sessions are flagged
    `is_warmup`, their cohort is the round.
    """
    spec = spec or MicrobenchSpec()
    lengths = np.repeat(np.asarray(spec.prompt_lengths, dtype="int64"), spec.prompts_per_length)
    n = len(lengths)
    keys = np.arange(n, dtype="int64")
    fill_s = np.arange(n) * spec.gap_s
    measure_s = fill_s[-1] + spec.round_gap_s + spec.gap_s + fill_s
    turns = pd.DataFrame({
        "session_id": np.arange(2 * n, dtype="int64"), "turn": 0, "pause_s": 0.0,
        "not_before_s": np.concatenate([fill_s, measure_s]),
        "append_tokens": np.tile(lengths, 2), "output_tokens": spec.output_tokens,
        "prompt_tokens": np.tile(lengths, 2), "is_resume": False,
        "append_kind": "prompt", "output_kind": "fixed",
    }).astype(TURN_COLUMNS)
    turns["round"] = np.repeat(np.array(["fill", "measure"], dtype=object), n)
    turns["prompt_key"] = np.tile(keys, 2)
    turns["prompt_length"] = np.tile(lengths, 2)
    sessions = pd.DataFrame({
        "session_id": turns.session_id, "arrival_s": turns.not_before_s, "n_turns": 1,
        "cohort": turns["round"], "is_warmup": turns["round"] == "fill",
        "end_reason": "complete",
    }).astype(SESSION_COLUMNS)
    tokens_spec = {"kind": "keyed", "seed": spec.seed, "vocab_size": spec.vocab_size}
    spec_dict = {"kind": "microbench", "params": spec.model_dump(mode="json"),
                 "tokens": tokens_spec}
    return Workload(spec_dict, sessions, turns,
                    KeyedTokens(spec.seed, spec.vocab_size, turns=turns))


# --------------------------------------------------------------------------- ShareGPT


_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
          "chatgpt": "assistant", "bard": "assistant", "bing": "assistant",
          "model": "assistant", "system": "system"}
_WHITESPACE = re.compile(r"\s*")


class _LineAt:
    """1-based line number of increasing positions in a text, counted incrementally."""

    def __init__(self, text: str) -> None:
        self.text, self.pos, self.line = text, 0, 1

    def __call__(self, pos: int) -> int:
        self.line += self.text.count("\n", self.pos, pos)
        self.pos = pos
        return self.line


def _json_array_entries(text: str,
                        problems: Problems) -> Iterator[tuple[int, int, Any, tuple[int, int]]]:
    """Yield (entry index, 1-based line, entry, its span in `text`) of a top-level JSON
    array, one at a time.

    Decoding entry by entry lets an error name the entry, and lets `strict=False` keep every
    entry before a truncation or corruption (the rest of the file is then unreadable).
    """
    decoder, line_at, index = json.JSONDecoder(), _LineAt(text), 0
    pos = _WHITESPACE.match(text, 0).end()
    if not text.startswith("[", pos):
        problems.add(line_at(pos), "expected a JSON array of conversations ('[' ...)")
        return
    pos = _WHITESPACE.match(text, pos + 1).end()
    while pos < len(text) and text[pos] != "]":
        try:
            entry, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            problems.add(err.lineno, f"entry {index}: malformed JSON ({err.msg}); "
                                     "truncated file? the rest of the file is skipped")
            return
        yield index, line_at(pos), entry, (pos, end)
        pos, index = _WHITESPACE.match(text, end).end(), index + 1
        if text.startswith(",", pos):
            pos = _WHITESPACE.match(text, pos + 1).end()
        elif not text.startswith("]", pos):
            problems.add(line_at(pos), f"expected ',' or ']' after entry {index - 1}; "
                                       "truncated file?")
            return
    if pos >= len(text):
        problems.add(line_at(len(text)), "missing closing ']'; truncated file?")


def _sharegpt_messages(entry: Any) -> list[tuple[str, str]]:
    """(role, text) of one entry's messages; ValueError says what is wrong."""
    if not isinstance(entry, dict):
        raise ValueError(f"expected an object, got {type(entry).__name__}")
    if "conversations" not in entry:
        raise ValueError("missing field 'conversations'")
    messages = entry["conversations"]
    if not isinstance(messages, list):
        raise ValueError("field 'conversations' must be a list")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "from" not in msg or "value" not in msg:
            raise ValueError(f"message {i} needs fields 'from' and 'value'")
        role = _ROLES.get(str(msg["from"]).lower())
        if role is None or not isinstance(msg["value"], str):
            raise ValueError(f"message {i}: unknown role {msg['from']!r} or non-text value")
        out.append((role, msg["value"]))
    return out


def sharegpt_turns(messages: list[tuple[str, str]],
                   tokens_per_char: float) -> list[tuple[int, int]]:
    """(append_tokens, output_tokens) per turn of one ShareGPT conversation.

    A turn is the user text since the last answer (system messages and answers before the
    first user message included) followed by the answer; consecutive answers merge. A final
    user message without an answer is dropped: its output length is unknown. Token counts are
    ceil(characters x tokens_per_char), at least 1.
    """
    def count(chars: int) -> int:
        return max(1, math.ceil(chars * tokens_per_char))

    turns: list[list[int]] = []
    pending_chars, has_user = 0, False
    for role, text in messages:
        if role == "assistant" and has_user:
            turns.append([count(pending_chars), count(len(text))])
            pending_chars, has_user = 0, False
        elif role == "assistant" and turns and not pending_chars:
            turns[-1][1] += count(len(text))
        else:
            pending_chars += len(text)
            has_user = has_user or role == "user"
    return [(a, o) for a, o in turns]


def _sharegpt_text(src: Path, problems: Problems) -> tuple[str, bool]:
    """The file's text, and whether it holds bytes that are not UTF-8: strict, the first one
    raises naming its line; lax, they become lone surrogates and their entries are skipped."""
    try:
        with open_bytes(src) as handle:
            data = handle.read()
    except (EOFError, OSError, zlib.error) as err:
        raise ValueError(f"{src}: unreadable ({err}); truncated file?") from err
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError as err:
        line, reason = not_utf8(err)
        if problems.strict:
            problems.add(line, reason)
        return data.decode("utf-8", "surrogateescape"), True


def read_sharegpt(path: str | Path, *, tokens_per_char: float = 0.25,
                  strict: bool = True) -> ReadResult:
    """Read a ShareGPT JSON file into the conversation table (`CONVERSATION_COLUMNS`).

    A malformed file or entry (bytes that are not UTF-8 included) raises ValueError naming
    the file, line, entry index and id; with `strict=False` bad entries are skipped (and
    listed) and the rest is kept. After
    malformed JSON (e.g. a truncated file) nothing further can be parsed: the entries before
    it are kept and the rest counts as one skipped problem. Entries decode one at a time
    (`json.JSONDecoder.raw_decode`) so that errors can name the entry.
    """
    src = Path(path)
    if not src.is_file():
        raise FileNotFoundError(f"ShareGPT file not found: {src}")
    problems, rows = Problems(src, strict), []
    text, undecodable = _sharegpt_text(src, problems)
    for index, line, entry, (start, end) in _json_array_entries(text, problems):
        source_id = str(entry.get("id", f"#{index}")) if isinstance(entry, dict) else f"#{index}"
        try:
            if undecodable and UNDECODABLE_RE.search(text, start, end):
                raise ValueError("holds bytes that are not UTF-8 text")
            turns = sharegpt_turns(_sharegpt_messages(entry), tokens_per_char)
        except ValueError as err:
            problems.add(line, f"entry {index} (id {source_id!r}): {err}")
            continue
        rows.extend((index, source_id, k, a, o) for k, (a, o) in enumerate(turns))
    frame = pd.DataFrame(rows, columns=list(CONVERSATION_COLUMNS)).astype(CONVERSATION_COLUMNS)
    return ReadResult(frame, problems.frame(), src, "sharegpt")


# --------------------------------------------------------------------------- Azure


_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BAD_ROW = "\x00"
_UNDECODABLE_ROW = "\x01"


def _keep_bad_row(fields: list[str]) -> list[str]:
    """Keep an over-long CSV row as a marked row, so later rows keep their line numbers."""
    return [_BAD_ROW + ",".join(fields), "", ""]


def _azure_problems(raw: pd.DataFrame) -> pd.Series:
    """Per row: why it is unusable ("" when fine), checking each column in order."""
    reason = pd.Series("", index=raw.index, dtype=object)
    # utc=True: a stamp with a UTC offset among naive ones (the trace's own) is one instant,
    # not pandas' "Mixed timezones detected" error for the whole file
    stamp = pd.to_datetime(raw["TIMESTAMP"], format="ISO8601", errors="coerce", utc=True)
    checks = [(raw["TIMESTAMP"].str.startswith(_BAD_ROW),
               "too many fields (expected 3: TIMESTAMP,ContextTokens,GeneratedTokens)"),
              (stamp.isna(), "TIMESTAMP is not a date-time")]
    for name, low in (("ContextTokens", 1), ("GeneratedTokens", 0)):
        value = pd.to_numeric(raw[name], errors="coerce")
        checks.append(((value.isna()) | (value % 1 != 0) | (value < low) | (value >= 2**63),
                       f"{name} must be an integer >= {low}"))
    for bad, text in reversed(checks):
        reason = reason.mask(bad, text)
    for index in reason.index[reason != ""]:
        text = raw.at[index, "TIMESTAMP"]
        if text.startswith(_UNDECODABLE_ROW):  # its TIMESTAMP is no date: flagged above
            reason[index] = text[1:]
            continue
        text = text[1:] if text.startswith(_BAD_ROW) else ",".join(raw.loc[index])
        reason[index] += f" (got {text[:80]!r})"
    return reason


def _azure_text(src: Path) -> str:
    """The CSV's text (plain or .gz), read line by line with a bound on each line's length:
    a line that is not UTF-8, or longer than `MAX_LINE_BYTES`, is replaced by one marked row
    saying why, so that it is one bad row with its own line number and never held whole."""
    lines = []
    with open_bytes(src) as handle:
        for _number, raw in bounded_lines(handle, MAX_LINE_BYTES):
            if raw is None:
                # no commas in the reason: it is one field of the marked row
                lines.append(f"{_UNDECODABLE_ROW}line longer than {MAX_LINE_BYTES} bytes "
                             "(the reader's max_line_bytes limit),,")
                continue
            try:
                lines.append(raw.decode("utf-8").rstrip("\r\n"))
            except UnicodeDecodeError as err:
                lines.append(f"{_UNDECODABLE_ROW}{not_utf8(err)[1]},,")
    return "\n".join(lines)


def _azure_rows(src: Path) -> pd.DataFrame:
    """The CSV's non-blank rows as text, indexed by line - 2 (the header is line 1).

    Read without a header, then the first row names the columns: with `header=0` pandas
    takes a first data row with one field too many as a sign that the file has an index
    column, and shifts every row by one column.
    """
    try:
        raw = pd.read_csv(io.StringIO(_azure_text(src)), header=None, dtype=str,
                          engine="python", skip_blank_lines=False, keep_default_na=False,
                          on_bad_lines=_keep_bad_row)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, EOFError, OSError,
            zlib.error) as err:
        raise ValueError(f"{src}:1: unreadable CSV ({err})") from err
    header = [str(name) for name in raw.iloc[0]] if len(raw) else []
    missing = [name for name in _AZURE_COLUMNS if header.count(name) != 1]
    if missing:
        raise ValueError(f"{src}:1: missing column(s) {missing}; header is {header} (each "
                         "column must appear once)")
    raw = raw.iloc[1:].set_axis(header, axis=1)
    raw = raw[list(_AZURE_COLUMNS)].fillna("").set_axis(raw.index - 1, axis=0)
    return raw[(raw != "").any(axis=1)]


def read_azure_trace(path: str | Path, *, strict: bool = True) -> ReadResult:
    """Read an Azure LLM inference trace CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`).

    Returns `arrival_s` (since the first row), `context_tokens`, `generated_tokens` and the
    file `line`. A bad row raises ValueError("file:line: reason"), or is skipped with
    `strict=False`. Line = row index + 2 (the header is line 1; the format has no quoted
    multi-line fields); blank lines are ignored but still counted.
    """
    src = Path(path)
    if not src.is_file():
        raise FileNotFoundError(f"Azure trace not found: {src}")
    raw = _azure_rows(src)
    problems, reasons = Problems(src, strict), _azure_problems(raw)
    for index, reason in reasons[reasons != ""].items():
        problems.add(int(index) + 2, reason)
    good = raw[reasons == ""]
    stamp = pd.to_datetime(good["TIMESTAMP"], format="ISO8601", utc=True)
    frame = pd.DataFrame({
        "arrival_s": (stamp - stamp.min()).dt.total_seconds().to_numpy(dtype="float64"),
        "context_tokens": good["ContextTokens"].astype(float).astype("int64").to_numpy(),
        "generated_tokens": good["GeneratedTokens"].astype(float).astype("int64").to_numpy(),
        "line": (good.index.to_numpy() + 2).astype("int64"),
    })
    return ReadResult(frame, problems.frame(), src, "azure_csv")


def geometric_turn_counts(mean_turns: float, n_rows: int | None, max_conversations: int,
                          rng: np.random.Generator) -> np.ndarray:
    """Turns per conversation, geometric on {1, 2, ...} with mean `mean_turns`.

    Draws until `max_conversations` or until the counts cover `n_rows` rows (the last count
    is then cut to what is left).
    """
    p = 1.0 / mean_turns
    counts = rng.geometric(p, size=max_conversations).astype("int64")
    if n_rows is None:
        return counts
    ends = np.cumsum(counts)
    keep = int(np.searchsorted(ends, n_rows, side="left")) + 1
    counts = counts[:keep]
    counts[-1] -= max(0, int(counts.sum()) - n_rows)
    return counts[counts > 0]


def azure_conversations(trace: ReadResult | pd.DataFrame, mean_turns: float, seed: int,
                        max_conversations: int) -> pd.DataFrame:
    """Group consecutive Azure rows into conversations of geometric length (mean `mean_turns`).

    Each row is one turn: ContextTokens is the turn's append, GeneratedTokens its output
    (at least 1 token). The Azure trace has no conversation ids, so this grouping is a
    modelling choice; the row order (arrival order) is kept. Azure's ContextTokens is a whole
    request's context, so treating it as a new append makes prompts grow faster than in a
    real chat: real lengths and a realistic mix, not real conversations.
    """
    rows = trace.frame if isinstance(trace, ReadResult) else trace
    rng = np.random.default_rng([seed, 21])
    counts = geometric_turn_counts(mean_turns, len(rows), max_conversations, rng)
    n = int(counts.sum())
    conversation = np.repeat(np.arange(len(counts), dtype="int64"), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    lines = rows["line"].to_numpy()[:n] if "line" in rows.columns else np.arange(n) + 2
    return pd.DataFrame({
        "conversation": conversation,
        "source_id": [f"line {lines[s]}" for s in starts],
        "turn": np.arange(n) - starts,
        "append_tokens": rows["context_tokens"].to_numpy()[:n],
        "output_tokens": np.maximum(rows["generated_tokens"].to_numpy()[:n], 1),
    }).astype(CONVERSATION_COLUMNS)


# --------------------------------------------------------------------------- macrobenchmark


class MacrobenchSpec(BaseModel):
    """Parameters of study B's multi-turn QPS sweep (figure B7); one spec per QPS point.

    Synthetic defaults follow ShareGPT's shape: about 4 turns per conversation, user appends
    of ~160 tokens and answers of ~340 tokens on average (vLLM paper's ShareGPT means), both
    lognormal. ShareGPT's own lengths are estimated from characters (`tokens_per_char`).
    """

    model_config = ConfigDict(extra="forbid")

    source: Literal["synthetic", "sharegpt", "azure"] = "synthetic"
    path: str | None = Field(None, description="ShareGPT JSON or Azure CSV (not synthetic)")
    strict: bool = Field(True, description="False skips malformed entries/rows of `path`")
    qps: float = Field(0.3, gt=0, description="aggregate request rate (study: 0.1-0.5)")
    num_users: int = Field(10, gt=0, description="users (conversations) active at once")
    max_conversations: int = Field(200, gt=0, description="conversations taken from source")
    tokens_per_char: float = Field(0.25, gt=0, description="token estimate of ShareGPT text")
    mean_turns: float = Field(4.0, ge=1, description="geometric turns (azure, synthetic)")
    append_mean_tokens: float = Field(160.0, gt=0, description="synthetic user append mean")
    append_sigma: float = Field(1.0, ge=0, description="lognormal shape of appends")
    append_max_tokens: int = Field(8192, gt=0, description="synthetic append clip")
    output_mean_tokens: float = Field(340.0, gt=0, description="synthetic answer mean")
    output_sigma: float = Field(1.0, ge=0, description="lognormal shape of answers")
    output_max_tokens: int = Field(2048, gt=0, description="synthetic answer clip")
    context_cap_tokens: int = Field(32_768, gt=0, description="max prompt + output per turn")
    shared_prefix_tokens: int = Field(0, ge=0, description="system prompt shared by sessions")
    warmup_s: float = Field(0.0, ge=0, description="sessions starting earlier are warm-up")
    seed: int = Field(0, ge=0, description="one seed for everything")
    vocab_size: int = Field(32_000, gt=FIRST_TOKEN_ID, description="token ids lie below this")

    @model_validator(mode="after")
    def _path_given(self) -> MacrobenchSpec:
        if self.source != "synthetic" and not self.path:
            raise ValueError(f"parameter 'path' is required for source {self.source!r}")
        return self

    @property
    def user_gap_s(self) -> float:
        """Spacing of one user's consecutive turns: num_users / qps."""
        return self.num_users / self.qps


def _lognormal_tokens(rng: np.random.Generator, mean: float, sigma: float, high: int,
                      n: int) -> np.ndarray:
    mu = math.log(mean) - sigma**2 / 2
    return np.clip(np.rint(rng.lognormal(mu, sigma, n)), 1, high).astype("int64")


def synthetic_conversations(spec: MacrobenchSpec) -> pd.DataFrame:
    """`max_conversations` ShareGPT-shaped conversations (`CONVERSATION_COLUMNS`).

    Turn counts, appends and outputs each come from their own generator.
    """
    counts = geometric_turn_counts(spec.mean_turns, None, spec.max_conversations,
                                   np.random.default_rng([spec.seed, 31]))
    n = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    conversation = np.repeat(np.arange(len(counts), dtype="int64"), counts)
    return pd.DataFrame({
        "conversation": conversation,
        "source_id": [f"synthetic-{c}" for c in conversation],
        "turn": np.arange(n) - starts,
        "append_tokens": _lognormal_tokens(np.random.default_rng([spec.seed, 32]),
                                           spec.append_mean_tokens, spec.append_sigma,
                                           spec.append_max_tokens, n),
        "output_tokens": _lognormal_tokens(np.random.default_rng([spec.seed, 33]),
                                           spec.output_mean_tokens, spec.output_sigma,
                                           spec.output_max_tokens, n),
    }).astype(CONVERSATION_COLUMNS)


def _cap_context(conversations: pd.DataFrame, spec: MacrobenchSpec) -> pd.DataFrame:
    """Add `prompt_tokens`; end each conversation before a turn whose context exceeds the cap.

    Takes the source's first `max_conversations` conversations; one whose very first turn
    exceeds the cap has no turn left and is dropped. `capped` marks cut conversations.
    """
    conv = conversations.sort_values(["conversation", "turn"], kind="stable")
    keep = conv["conversation"].drop_duplicates().iloc[:spec.max_conversations]
    conv = conv[conv["conversation"].isin(keep)]
    grouped = conv.groupby("conversation", sort=False)
    prompt = (spec.shared_prefix_tokens + grouped["append_tokens"].cumsum()
              + grouped["output_tokens"].cumsum() - conv["output_tokens"])
    conv = conv.assign(prompt_tokens=prompt.astype("int64"))
    fits = conv["prompt_tokens"] + conv["output_tokens"] <= spec.context_cap_tokens
    fits = fits.groupby(conv["conversation"], sort=False).cummin()
    capped = (~fits).groupby(conv["conversation"], sort=False).transform("any")
    return conv.assign(capped=capped)[fits].reset_index(drop=True)


def _user_starts(n_turns: np.ndarray, spec: MacrobenchSpec) -> tuple[np.ndarray, np.ndarray]:
    """Start time and user of each conversation, in LMCache multi-round-QA fashion.

    User u sends at u / qps + k x num_users / qps (k = 0, 1, ...), so together the users send
    qps requests per second; the next conversation goes to the user that is free first.
    """
    free = [(u / spec.qps, u) for u in range(spec.num_users)]
    heapq.heapify(free)
    starts, users = np.empty(len(n_turns)), np.empty(len(n_turns), dtype="int64")
    for i, n in enumerate(n_turns):
        start_s, user = heapq.heappop(free)
        starts[i], users[i] = start_s, user
        heapq.heappush(free, (start_s + int(n) * spec.user_gap_s, user))
    return starts, users


def schedule_conversations(conversations: pd.DataFrame, spec: MacrobenchSpec,
                           source: dict[str, Any] | None = None) -> Workload:
    """Turn a conversation table into study B's multi-user open-loop workload.

    Each conversation is a session; turn k of a conversation that starts at t is sent no
    earlier than t + k x num_users / qps (and after the previous answer). prompt_tokens =
    shared prefix + all appends so far + all earlier outputs. The spec's `source` entry
    records how many conversations were dropped because their first turn exceeds the cap.
    """
    conv = _cap_context(conversations, spec)
    source = {**(source or {"format": spec.source}),
              "conversations_over_cap_dropped": int(
                  min(spec.max_conversations, conversations["conversation"].nunique())
                  - conv["conversation"].nunique())}
    first = conv.groupby("conversation", sort=False).agg(
        n_turns=("turn", "size"), source_id=("source_id", "first"), capped=("capped", "first"))
    starts, users = _user_starts(first["n_turns"].to_numpy(), spec)
    session_of = pd.Series(np.arange(len(first)), index=first.index)
    session_id = session_of.loc[conv["conversation"]].to_numpy()
    turns = pd.DataFrame({
        "session_id": session_id, "turn": conv["turn"].to_numpy(), "pause_s": 0.0,
        "not_before_s": starts[session_id] + conv["turn"].to_numpy() * spec.user_gap_s,
        "append_tokens": conv["append_tokens"].to_numpy(),
        "output_tokens": conv["output_tokens"].to_numpy(),
        "prompt_tokens": conv["prompt_tokens"].to_numpy(), "is_resume": False,
        "append_kind": "user", "output_kind": "answer",
    }).astype(TURN_COLUMNS)
    turns["user"] = users[session_id]
    sessions = pd.DataFrame({
        "session_id": np.arange(len(first)), "arrival_s": starts,
        "n_turns": first["n_turns"].to_numpy(), "cohort": spec.source,
        "is_warmup": starts < spec.warmup_s,
        "end_reason": np.where(first["capped"].to_numpy(), "cap", "complete"),
    }).astype(SESSION_COLUMNS)
    sessions["user"] = users
    sessions["source_id"] = first["source_id"].to_numpy(dtype=object)
    tokens_spec = {"kind": "seeded", "seed": spec.seed, "vocab_size": spec.vocab_size,
                   "shared_prefix_tokens": spec.shared_prefix_tokens}
    spec_dict = {"kind": "macrobench", "params": spec.model_dump(mode="json"),
                 "source": source, "tokens": tokens_spec}
    tokens = SeededTokens(spec.seed, spec.vocab_size,
                          shared_prefix_tokens=spec.shared_prefix_tokens)
    return Workload(spec_dict, sessions, turns, tokens)


def macrobenchmark(spec: MacrobenchSpec | None = None) -> Workload:
    """Study B's multi-turn workload at one QPS, from ShareGPT, Azure or the synthetic shape."""
    spec = spec or MacrobenchSpec()
    source: dict[str, Any] = {"format": spec.source, "path": spec.path}
    if spec.source == "synthetic":
        conversations = synthetic_conversations(spec)
    elif spec.source == "sharegpt":
        read = read_sharegpt(spec.path, tokens_per_char=spec.tokens_per_char,
                             strict=spec.strict)
        conversations, source["skipped"] = read.frame, read.n_skipped
    else:
        read = read_azure_trace(spec.path, strict=spec.strict)
        conversations = azure_conversations(read, spec.mean_turns, spec.seed,
                                            spec.max_conversations)
        source["skipped"] = read.n_skipped
    return schedule_conversations(conversations, spec, source)
