"""The workload as data: sessions and turns, plus the token ids each prompt is made of.

Every engine (live vLLM or the simulator) and every tier runs the same `Workload`. It is two
tables and a token source:

* `sessions`: one row per session (`SESSION_COLUMNS`): when it arrives, its cohort, why it ended.
* `turns`: one row per request (`TURN_COLUMNS`), in session order. A turn is sent at
  max(previous turn's finish + `pause_s`, `not_before_s`); `not_before_s` is NaN for
  closed-loop turns and the arrival time for a session's first turn (or an open-loop schedule).
  `prompt_tokens` is the prompt length assuming every earlier output had `output_tokens` tokens.
  Optional column `context_start_turn`: the turn whose append starts the current context
  (a compacted session starts afresh); without it every prompt starts at turn 0.
* a `TokenSource` that turns (session, turn) into token ids, so that a live engine sees real
  shared prefixes: turn k+1's prompt = turn k's prompt + turn k's output + turn k+1's append.

Workloads are saved as `sessions.parquet`, `turns.parquet` and `workload.json` (the spec).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from kvrepro._checks import require_columns

SESSION_COLUMNS: dict[str, str] = {
    "session_id": "int64", "arrival_s": "float64", "n_turns": "int64",
    "cohort": "object", "is_warmup": "bool", "end_reason": "object",
}
TURN_COLUMNS: dict[str, str] = {
    "session_id": "int64", "turn": "int64", "pause_s": "float64", "not_before_s": "float64",
    "append_tokens": "int64", "output_tokens": "int64", "prompt_tokens": "int64",
    "is_resume": "bool", "append_kind": "object", "output_kind": "object",
}


class TokenSource(Protocol):
    """Produces the token ids of one turn's append and of its nominal output."""

    def append_ids(self, turns_row: pd.Series) -> np.ndarray: ...

    def output_ids(self, turns_row: pd.Series) -> np.ndarray: ...


@dataclass
class SeededTokens:
    """Token ids drawn from a generator seeded by (seed, session, turn, part).

    Distinct sessions get distinct ids (no shared prefix across sessions unless the spec
    adds a `shared_prefix_tokens` block, which every session's first append starts with).
    Ids lie in [first_id, vocab_size) so special tokens of small vocabularies are avoided.
    """

    seed: int
    vocab_size: int = 32_000
    first_id: int = 16
    shared_prefix_tokens: int = 0

    def _draw(self, key: tuple[int, ...], n: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 4, *key])
        return rng.integers(self.first_id, self.vocab_size, size=n, dtype=np.int64)

    def append_ids(self, row: pd.Series) -> np.ndarray:
        ids = self._draw((int(row.session_id), int(row.turn), 0), int(row.append_tokens))
        if int(row.turn) == 0 and self.shared_prefix_tokens:
            prefix = self._draw((2**31 - 1,), self.shared_prefix_tokens)
            ids = np.concatenate([prefix, ids])
        return ids

    def output_ids(self, row: pd.Series) -> np.ndarray:
        return self._draw((int(row.session_id), int(row.turn), 1), int(row.output_tokens))


@dataclass(frozen=True, eq=False)
class _TurnIndex:
    """One pass over a turns table: each session's rows (plain tuples, in turn order).

    Token sources take a row as a `pd.Series` with the table's columns; building those from
    tuples and one shared column index costs microseconds, where slicing the DataFrame per
    prompt (`iloc`, `itertuples`) cost about 0.6 ms.
    """

    turns: pd.DataFrame  # the table it was built from (kept to tell when it is replaced)
    columns: pd.Index
    turn_pos: int
    context_pos: int | None  # position of `context_start_turn`, when the table has it
    by_session: dict[int, list[tuple[Any, ...]]]

    @classmethod
    def build(cls, turns: pd.DataFrame) -> _TurnIndex:
        ordered = turns.sort_values(["session_id", "turn"], kind="stable")
        columns = pd.Index(ordered.columns)
        sid_pos = columns.get_loc("session_id")
        by_session: dict[int, list[tuple[Any, ...]]] = {}
        for values in ordered.itertuples(index=False, name=None):
            by_session.setdefault(int(values[sid_pos]), []).append(values)
        context = "context_start_turn"
        return cls(turns, columns, columns.get_loc("turn"),
                   columns.get_loc(context) if context in columns else None, by_session)

    def context_rows(self, session_id: int, turn: int) -> list[tuple[Any, ...]]:
        """The rows of `turn`'s context: from its `context_start_turn` (else turn 0) to it."""
        rows = [r for r in self.by_session.get(int(session_id), ())
                if r[self.turn_pos] <= turn]
        if not rows or rows[-1][self.turn_pos] != turn:
            raise KeyError(f"no turn {turn} in session {session_id}")
        if self.context_pos is not None:
            first = int(rows[-1][self.context_pos])
            rows = [r for r in rows if r[self.turn_pos] >= first]
        return rows


@dataclass
class Workload:
    """Sessions, turns, the spec that generated them, and their token ids."""

    spec: dict[str, Any]
    sessions: pd.DataFrame
    turns: pd.DataFrame
    tokens: TokenSource = field(repr=False)
    _by_session: _TurnIndex | None = field(default=None, init=False, repr=False,
                                           compare=False)

    def _turn_index(self) -> _TurnIndex:
        """The index of `turns` by session, built on first use and kept until `turns` is
        replaced by another table (editing the table in place is not seen: assign a new one)."""
        index = self._by_session
        if index is None or index.turns is not self.turns:
            index = self._by_session = _TurnIndex.build(self.turns)
        return index

    def prompt_ids(self, session_id: int, turn: int,
                   outputs: list[np.ndarray] | None = None) -> np.ndarray:
        """Token ids of one turn's prompt: all earlier appends and outputs, then this append.

        `outputs` replaces the nominal outputs of earlier turns with what an engine really
        generated (a live server's own token ids), keeping the prefix the server cached.
        The session's rows come from an index built once per `turns` table, so a call costs
        the session's own turns, not a scan of the table (which made N one-turn prompts
        cost O(N^2): 7.5 s of CPU for 5,000 before a live client's first send).
        """
        index = self._turn_index()
        rows = index.context_rows(session_id, turn)
        parts: list[np.ndarray] = []
        for i, values in enumerate(rows):
            series = pd.Series(values, index=index.columns, dtype=object)
            parts.append(self.tokens.append_ids(series))
            if values[index.turn_pos] < turn:
                given = outputs[i] if outputs is not None and i < len(outputs) else None
                parts.append(given if given is not None else self.tokens.output_ids(series))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def digest(self) -> str:
        """SHA-256 of the spec and tables: equal digests mean an identical workload.

        Built from raw column bytes (not pandas' hashing) so it is stable across library
        versions and machines; tests pin the default workload's digest.
        """
        h = hashlib.sha256(json.dumps(self.spec, sort_keys=True, default=str).encode())
        for table in (self.sessions, self.turns):
            for name in sorted(table.columns):
                h.update(name.encode())
                h.update(_column_bytes(table[name]))
        return h.hexdigest()


def _column_bytes(column: pd.Series) -> bytes:
    if column.dtype == bool:
        return column.to_numpy(dtype=np.uint8).tobytes()
    if pd.api.types.is_integer_dtype(column):
        return column.to_numpy(dtype="<i8").tobytes()
    if pd.api.types.is_float_dtype(column):
        return np.round(column.to_numpy(dtype="<f8"), 9).tobytes()
    return "\x1f".join(map(str, column.tolist())).encode()


def turn_value(row: pd.Series, turns: pd.DataFrame | None, column: str, who: str) -> Any:
    """A per-turn value a token source needs: from the row itself, else from `turns`."""
    if column in row.index:
        return row[column]
    if turns is None or column not in turns.columns:
        raise KeyError(f"{who} needs a {column!r} column in the row or in turns")
    match = turns[(turns.session_id == row.session_id) & (turns.turn == row.turn)]
    if match.empty:
        raise KeyError(f"no turn {row.turn} of session {row.session_id} in turns")
    return match[column].iloc[0]


TOKEN_SOURCES: dict[str, Any] = {"seeded": SeededTokens}
"""Token source kinds by name; `spec["tokens"]["kind"]` picks one when a workload is loaded.
A kind's class is built as cls(**spec["tokens"] without "kind"); kinds that need per-turn data
(e.g. block hashes) read it from columns of `turns`, passed as `turns=` when they accept it."""


def token_source_from_spec(tokens_spec: dict[str, Any], turns: pd.DataFrame) -> TokenSource:
    """Rebuild a workload's token source from the `tokens` entry of its spec."""
    params = dict(tokens_spec)
    kind = params.pop("kind", None)
    if kind not in TOKEN_SOURCES:
        raise ValueError(f"unknown token source kind {kind!r} in workload spec; "
                         f"known: {sorted(TOKEN_SOURCES)}")
    cls = TOKEN_SOURCES[kind]
    if "turns" in getattr(cls, "__dataclass_fields__", {}):
        params["turns"] = turns
    return cls(**params)


def save_workload(workload: Workload, directory: str | Path) -> Path:
    """Write `sessions.parquet`, `turns.parquet` and `workload.json` into `directory`."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    workload.sessions.to_parquet(out / "sessions.parquet", index=False)
    workload.turns.to_parquet(out / "turns.parquet", index=False)
    meta = {"spec": workload.spec, "digest": workload.digest()}
    (out / "workload.json").write_text(json.dumps(meta, indent=2, default=str))
    return out


def load_workload(directory: str | Path) -> Workload:
    """Read a workload written by `save_workload`, checking columns and the digest."""
    src = Path(directory)
    for name in ("workload.json", "sessions.parquet", "turns.parquet"):
        if not (src / name).is_file():
            raise FileNotFoundError(f"workload folder {src} lacks {name}")
    meta = json.loads((src / "workload.json").read_text())
    sessions = pd.read_parquet(src / "sessions.parquet")
    turns = pd.read_parquet(src / "turns.parquet")
    for table, columns, name in ((sessions, SESSION_COLUMNS, "sessions"),
                                 (turns, TURN_COLUMNS, "turns")):
        require_columns(table, columns, str(src / (name + ".parquet")))
    tokens = token_source_from_spec(meta["spec"]["tokens"], turns)
    workload = Workload(meta["spec"], sessions, turns, tokens)
    if meta.get("digest") and workload.digest() != meta["digest"]:
        raise ValueError(f"{src}: tables do not match the digest in workload.json "
                         "(edited or truncated files?)")
    return workload


def summarize(workload: Workload) -> pd.Series:
    """The numbers a reader checks first: counts, rates, token totals, resumes."""
    s, t = workload.sessions, workload.turns
    span_s = float(s.arrival_s.max() - s.arrival_s.min()) if len(s) > 1 else float("nan")
    return pd.Series({
        "sessions": len(s),
        "turns": len(t),
        "session_arrivals_per_min": (len(s) - 1) / span_s * 60 if span_s else float("nan"),
        "turns_per_session_mean": t.groupby("session_id").size().mean(),
        "append_tokens_mean": t.append_tokens.mean(),
        "output_tokens_mean": t.output_tokens.mean(),
        "prompt_tokens_max": int(t.prompt_tokens.max()),
        "prompt_tokens_total": int(t.prompt_tokens.sum()),
        "output_tokens_total": int(t.output_tokens.sum()),
        "resumes": int(t.is_resume.sum()),
    })
