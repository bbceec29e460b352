"""A synthetic request trace in the Qwen-Bailian block-hash format: B2's *stand-in*.

The real trace (Qwen-Bailian traceA, `qwen_traceA_blksz_16.jsonl` of
github.com/alibaba-edu/qwen-bailian-usagetraces-anon, characterised in "KVCache Cache in the
Wild", USENIX ATC'25) is in Git LFS and not shipped, so wherever it is not at hand (notebook
09, tests) this trace stands in: multi-turn chats whose turns share their parent's full blocks,
request types as in the real trace, and defaults chosen so that its statistics match the ones
published for traceA (`TRACE_A_PUBLISHED`; `stand_in_statistics` prints both side by side).
`kvrepro.workload.trace_replay` reads it like the real file; `kvrepro.analysis.block_traces`
analyses both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvrepro._checks import non_negative, positive
from kvrepro.analysis.block_traces import reuse_summary
from kvrepro.workload.trace_replay import ReadResult

BAILIAN_TYPES = ("text", "search", "file", "image")
TEN_MINUTES_S = 600.0


@dataclass(frozen=True)
class PublishedStatistic:
    """One statistic published for the real traceA, and where it is published."""

    value: float
    source: str


_REPO = "qwen-bailian-usagetraces-anon README"
_PAPER = "Wang et al., KVCache Cache in the Wild (USENIX ATC'25)"
TRACE_A_PUBLISHED: dict[str, PublishedStatistic] = {
    "requests": PublishedStatistic(43_000, "about 43,000 as issue 16 quotes it (not in the "
                                           "README)"),
    "duration_h": PublishedStatistic(2.0, f"{_REPO}: a two-hour trace, timestamps in seconds "
                                          "since its start"),
    "block_tokens": PublishedStatistic(16, f"{_REPO}: 16 tokens per block"),
    "ideal_hit_ratio": PublishedStatistic(0.62, f"{_PAPER}: ideal hit ratios of 54 % and 62 % "
                                                "for its two traces; 62 % traceA's as issue 16 "
                                                "reads it"),
    "reuse_share_within_10_min": PublishedStatistic(
        0.80, f"{_PAPER}: 80 % of traceA's reuses within 10 min"),
}
"""traceA's published statistics the stand-in's defaults were chosen to match."""


@dataclass(frozen=True)
class BailianSpec:
    """Parameters of the stand-in Qwen-Bailian-format trace (the real one is in Git LFS).

    Chosen to match traceA's published statistics (`TRACE_A_PUBLISHED`), not fitted to B2:
    a 2-hour window of 16-token blocks; chats arrive at 2 per second, which with ~3 turns per
    chat gives about 43,000 requests; later turns follow a median 200 s after the previous
    one with a wide spread (lognormal sigma 1.5, 2 s to 1 h), so that about 80 % of block
    reuses lie within 10 minutes and, with the contexts below, about 62 % of block uses are
    reuses. Every prompt starts with a 45-token system prompt shared by all chats (as in the
    shipped sample); first turns add a type-specific context (search results ~2K tokens,
    files ~6K, images ~1.2K, plain text nothing) and a user message (median 60 tokens); each
    later turn repeats the whole previous prompt plus the previous answer (median 250 tokens)
    plus a new message. Chats stop at `max_context_tokens`. Like a window cut from a running
    service, chats start from `warmup_s` (1 h: long enough for the working set to settle)
    before the window and only requests inside [0, duration_s) are kept (their parents may
    lie outside). It has no daily load swing, unlike the real trace.
    """

    seed: int = 0
    duration_s: float = 7200.0
    warmup_s: float = 3600.0
    chat_rate_per_s: float = 2.0
    mean_turns: float = 3.0
    max_turns: int = 40
    type_probabilities: tuple[float, ...] = (0.6, 0.2, 0.1, 0.1)
    system_prompt_tokens: int = 45
    search_context_median_tokens: float = 2000.0
    file_context_median_tokens: float = 6000.0
    image_tokens_range: tuple[int, int] = (800, 1600)
    message_median_tokens: float = 60.0
    output_median_tokens: float = 250.0
    turn_gap_median_s: float = 200.0
    turn_gap_sigma: float = 1.5
    max_context_tokens: int = 32_768
    block_tokens: int = 16


def _lognormal(rng: np.random.Generator, median: float, sigma: float, size: int,
               low: int, high: int) -> np.ndarray:
    return np.clip(np.rint(rng.lognormal(np.log(median), sigma, size)), low, high).astype(int)


def _first_context_tokens(rng: np.random.Generator, spec: BailianSpec,
                          kinds: np.ndarray) -> np.ndarray:
    """Tokens a chat's first turn adds besides system prompt and message, by request type."""
    n = len(kinds)
    search = _lognormal(rng, spec.search_context_median_tokens, 0.5, n, 200, 16_000)
    file = _lognormal(rng, spec.file_context_median_tokens, 0.8, n, 500, 24_000)
    image = rng.integers(spec.image_tokens_range[0], spec.image_tokens_range[1] + 1, n)
    return np.select([kinds == 1, kinds == 2, kinds == 3], [search, file, image], 0)


def _chat_turns(rng: np.random.Generator, spec: BailianSpec) -> pd.DataFrame:
    """One row per turn: chat index, turn, arrival, input and output tokens, type."""
    n_chats = rng.poisson(spec.chat_rate_per_s * (spec.warmup_s + spec.duration_s))
    starts = np.sort(rng.uniform(-spec.warmup_s, spec.duration_s, n_chats))
    kinds = rng.choice(len(BAILIAN_TYPES), n_chats, p=np.asarray(spec.type_probabilities))
    n_turns = np.minimum(rng.geometric(1.0 / spec.mean_turns, n_chats), spec.max_turns)
    context = spec.system_prompt_tokens + _first_context_tokens(rng, spec, kinds)
    rows = []
    for chat in range(n_chats):
        k = int(n_turns[chat])
        messages = _lognormal(rng, spec.message_median_tokens, 1.0, k, 2, 4000)
        outputs = _lognormal(rng, spec.output_median_tokens, 0.8, k, 1, 4096)
        gaps = _lognormal(rng, spec.turn_gap_median_s * 1000, spec.turn_gap_sigma, k, 2000,
                          3_600_000) / 1000
        arrival, prompt = float(starts[chat]), int(context[chat])
        for turn in range(k):
            prompt += int(messages[turn])
            if prompt > spec.max_context_tokens or arrival >= spec.duration_s:
                break
            rows.append((chat, turn + 1, round(arrival, 3) + 0.0, prompt, int(outputs[turn]),
                         int(kinds[chat])))
            prompt += int(outputs[turn])
            arrival += float(gaps[turn])
    turns = pd.DataFrame(rows, columns=["chat", "turn", "timestamp", "input_length",
                                        "output_length", "kind"])
    return turns.sort_values(["timestamp", "chat"], kind="stable").reset_index(drop=True)


def _hash_keys(turns: pd.DataFrame, spec: BailianSpec) -> list[np.ndarray]:
    """Block keys per request: shared system blocks, then (chat, position) blocks, then a
    request-unique key for a partial last block (its content changes once output fills it)."""
    shared_blocks = spec.system_prompt_tokens // spec.block_tokens
    out = []
    for request, (chat, length) in enumerate(zip(turns["chat"], turns["input_length"],
                                                 strict=True)):
        n_full, partial = divmod(int(length), spec.block_tokens)
        pos = np.arange(n_full, dtype=np.int64)
        keys = np.where(pos < shared_blocks, pos, (int(chat) + 1) * (1 << 21) + pos)
        if partial:
            keys = np.r_[keys, (1 << 62) + request]
        out.append(keys)
    return out


def synthetic_bailian_frame(spec: BailianSpec | None = None) -> pd.DataFrame:
    """The synthetic trace as the raw Qwen-Bailian columns, in timestamp order.

    Deterministic from `spec.seed`. chat_id numbers all generated requests in time order
    (warm-up ones included, so the window's ids start above 0), parent_chat_id is the chat's
    previous request (-1 for its first), hash ids are integers in order of first appearance
    in the window (as in the real trace).
    """
    spec = spec or BailianSpec()
    positive(duration_s=spec.duration_s, chat_rate_per_s=spec.chat_rate_per_s,
             block_tokens=spec.block_tokens)
    if spec.mean_turns < 1:
        raise ValueError(f"parameter 'mean_turns' must be >= 1, got {spec.mean_turns}")
    non_negative(warmup_s=spec.warmup_s)
    turns = _chat_turns(np.random.default_rng(spec.seed), spec)
    chat_id = np.arange(len(turns), dtype=np.int64)
    parent = pd.Series(chat_id).groupby(turns["chat"]).shift(1).fillna(-1).astype(np.int64)
    inside = (turns["timestamp"] >= 0).to_numpy()
    turns, chat_id, parent = turns[inside].reset_index(drop=True), chat_id[inside], parent[inside]
    keys = _hash_keys(turns, spec)
    flat = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
    _, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    ids = np.split(rank[inverse], np.cumsum([len(k) for k in keys])[:-1])
    return pd.DataFrame({
        "chat_id": chat_id, "parent_chat_id": parent.to_numpy(), "timestamp": turns["timestamp"],
        "input_length": turns["input_length"], "output_length": turns["output_length"],
        "type": [BAILIAN_TYPES[k] for k in turns["kind"]], "turn": turns["turn"],
        "hash_ids": [a.tolist() for a in ids]})


def synthetic_bailian(path: str | Path, spec: BailianSpec | None = None) -> Path:
    """Write the synthetic trace as JSON Lines readable by `read_qwen_bailian_trace`."""
    frame = synthetic_bailian_frame(spec)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as handle:
        for record in frame.to_dict("records"):
            handle.write(json.dumps({k: (v if isinstance(v, list | str) else
                                         (float(v) if k == "timestamp" else int(v)))
                                     for k, v in record.items()}) + "\n")
    return out


def stand_in_statistics(trace: pd.DataFrame | ReadResult, block_tokens: int | None = None,
                        name: str = "stand-in") -> pd.DataFrame:
    """A Bailian-format trace's statistics next to traceA's published ones.

    `trace` is a reader's `ReadResult` or frame (`arrival_s`) or `synthetic_bailian_frame`'s
    raw columns (`timestamp`). The ideal hit ratio counts every block the trace lists, its
    padded partial last block included (`partial_blocks="whole"`), as the paper counts hash
    blocks; reuses count per block use. Timestamps are read as seconds (the format's unit:
    `duration_h` of a file in another unit would be off by that factor). Columns: statistic,
    `name`, published, source.
    """
    if isinstance(trace, ReadResult):
        block_tokens = block_tokens or trace.block_size
        trace = trace.frame
    frame = trace.rename(columns={"timestamp": "arrival_s"})
    block_tokens = block_tokens or BailianSpec().block_tokens
    reuse = reuse_summary(frame, TEN_MINUTES_S, block_tokens, 1, partial_blocks="whole")
    ours = {
        "requests": float(len(frame)),
        "duration_h": float(frame["arrival_s"].max() - frame["arrival_s"].min()) / 3600.0,
        "block_tokens": float(block_tokens),
        "ideal_hit_ratio": reuse["ideal_hit_ratio"],
        "reuse_share_within_10_min": reuse["reuse_share_within"]}
    return pd.DataFrame({"statistic": list(TRACE_A_PUBLISHED),
                         name: [ours[k] for k in TRACE_A_PUBLISHED],
                         "published": [p.value for p in TRACE_A_PUBLISHED.values()],
                         "source": [p.source for p in TRACE_A_PUBLISHED.values()]})
