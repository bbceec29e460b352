"""Which KV blocks two prompts share, derived from the workload without making token ids.

vLLM caches full blocks keyed by a hash of every token up to the block's end; LMCache does the
same per chunk. Generating token ids to hash them would cost seconds per run, so the simulator
names blocks by where their tokens come from instead. A prompt is split into *segments*, token
ranges with a stable identity; a block (or chunk) belongs to the segment holding its last
token, and is named (segment, index counted from the segment's first token). Because a segment
always starts at the same token position, equal names mean equal token prefixes.

Rules by workload kind:

* sessions (agentic, macrobench): segment = the session's current context,
  key (session_id, context_start_turn). Turn k+1's prompt is turn k's prompt + output + an
  append, so its first blocks are turn k's. A `shared_prefix_tokens` system prompt (only in a
  context that starts at turn 0, as `SeededTokens` makes it) is a segment of its own, shared
  by all sessions: units ending inside it are shared, the first unit reaching past it is not.
* microbenchmark (`prompt_key` column): one segment per key; equal keys, equal prompts.
* block-hash traces (`hash_ids` column, block size in spec["tokens"]["block_size"]): one
  segment per full trace block (its hash is a prefix hash, so it names the whole prefix), then
  a tail segment for the partial last trace block and the output.

Only full units are cached (like vLLM); a segment's last range is open-ended, so the blocks of
generated tokens continue the context they extend.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from kvrepro.workload.base import Workload

SEGMENT_SHIFT = 32
"""Unit ids are (segment number << SEGMENT_SHIFT) | index within the segment."""
OPEN = -1
"""End of an open-ended (last) segment range."""

Segments = tuple[tuple[int, int], ...]
"""(segment number, first token) pairs in prompt order; the last one is open-ended."""
UnitRanges = tuple[tuple[int, int, int], ...]
"""(segment number, first unit, end unit or OPEN) for one unit size (block or chunk)."""


def _shared_prefix_tokens(spec: dict[str, Any]) -> int:
    for part in ("params", "tokens"):
        value = (spec.get(part) or {}).get("shared_prefix_tokens")
        if value:
            return int(value)
    return 0


class BlockIdentity:
    """Segments of every turn's prompt (see the module docstring for the rules).

    `segments(row)` takes the turn's position in `workload.turns`. Segment keys are numbered
    densely in order of first use, so ids are small ints and the same workload always gives
    the same numbers when turns are asked for in the same order.
    """

    def __init__(self, workload: Workload):
        turns = workload.turns
        self.session_id: list[int] = turns["session_id"].astype("int64").tolist()
        self.shared_tokens = _shared_prefix_tokens(workload.spec)
        self._numbers: dict[Hashable, int] = {}
        if "hash_ids" in turns.columns:
            self.rule = "trace"
            self.trace_block_tokens = int(workload.spec["tokens"]["block_size"])
            self.hash_ids: list[tuple[int, ...]] = [tuple(int(h) for h in ids)
                                                    for ids in turns["hash_ids"]]
            self.prompt_tokens: list[int] = turns["prompt_tokens"].astype("int64").tolist()
        elif "prompt_key" in turns.columns:
            self.rule = "keyed"
            self.prompt_key: list[int] = turns["prompt_key"].astype("int64").tolist()
        else:
            self.rule = "context"
            start = (turns["context_start_turn"] if "context_start_turn" in turns.columns
                     else np.zeros(len(turns), dtype="int64"))
            self.context_start: list[int] = np.asarray(start, dtype="int64").tolist()

    def segment_number(self, key: Hashable) -> int:
        """Dense number of a segment key (assigned on first use)."""
        number = self._numbers.get(key)
        if number is None:
            number = self._numbers[key] = len(self._numbers)
        return number

    def segments(self, row: int) -> Segments:
        """The segments of turn `row`'s prompt (and of the output that follows it)."""
        if self.rule == "trace":
            return self._trace_segments(row)
        if self.rule == "keyed":
            return ((self.segment_number(("key", self.prompt_key[row])), 0),)
        own_key = ("ctx", self.session_id[row], self.context_start[row])
        if self.shared_tokens and self.context_start[row] == 0:
            return ((self.segment_number(("shared",)), 0),
                    (self.segment_number(own_key), self.shared_tokens))
        return ((self.segment_number(own_key), 0),)

    def _trace_segments(self, row: int) -> Segments:
        size, hashes = self.trace_block_tokens, self.hash_ids[row]
        n_full = min(self.prompt_tokens[row] // size, len(hashes))
        segments = [(self.segment_number(("hash", h)), j * size)
                    for j, h in enumerate(hashes[:n_full])]
        tail = (("tail", hashes[n_full]) if n_full < len(hashes)
                else ("out", self.session_id[row], row))
        segments.append((self.segment_number(tail), n_full * size))
        return tuple(segments)


def unit_ranges(segments: Segments, unit_tokens: int) -> UnitRanges:
    """Which units (blocks or chunks of `unit_tokens`) fall in which segment.

    Unit u covers tokens [u*U, (u+1)*U) and belongs to the segment holding token (u+1)*U - 1,
    so segment [s, e) holds units [s // U, e // U). Empty ranges are kept (harmless).
    """
    out = []
    for i, (number, start) in enumerate(segments):
        end = segments[i + 1][1] // unit_tokens if i + 1 < len(segments) else OPEN
        out.append((number, start // unit_tokens, end))
    return tuple(out)


def unit_ids(ranges: UnitRanges, first: int, end: int) -> list[int]:
    """Ids of units [first, end): (segment << SEGMENT_SHIFT) | index within the segment."""
    ids: list[int] = []
    for number, u0, u1 in ranges:
        stop = end if u1 == OPEN else min(u1, end)
        start = max(u0, first)
        if start < stop:
            base = (number << SEGMENT_SHIFT) - u0
            ids.extend(range(base + start, base + stop))
        if u1 != OPEN and u1 >= end:
            break
    return ids


def block_ids(identity: BlockIdentity, row: int, n_tokens: int, block_tokens: int) -> list[int]:
    """Ids of the full blocks of the first `n_tokens` tokens of turn `row`'s context.

    A reference for tests and readers; the caches work on segment counts, not on these lists.
    """
    return unit_ids(unit_ranges(identity.segments(row), block_tokens), 0,
                    n_tokens // block_tokens)
