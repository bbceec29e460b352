"""A synthetic request trace in the Qwen-Bailian block-hash format (the real one is in Git LFS).

It stands in for the real trace wherever it is not at hand (notebook 09, tests): multi-turn
chats whose turns share their parent's full blocks, request types as in the real trace, and a
working set of the size the real one gives. `kvrepro.workload.trace_replay` reads it like the
real file; `kvrepro.analysis.block_traces` analyses both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvrepro._checks import non_negative, positive

BAILIAN_TYPES = ("text", "search", "file", "image")


@dataclass(frozen=True)
class BailianSpec:
    """Parameters of the synthetic Qwen-Bailian-format trace (the real one is in Git LFS).

    Choices, not fits: chats arrive at 1 per second, which with ~3 turns per chat gives about
    the request rate of the real Mooncake conversation trace (12,031 requests in 1 h). Every
    prompt starts with a 45-token system prompt shared by all chats (as in the shipped sample);
    first turns add a type-specific context (search results ~2K tokens, files ~6K, images
    ~1.2K, plain text nothing) and a user message (median 60 tokens); each later turn repeats
    the whole previous prompt plus the previous answer (median 250 tokens) plus a new message,
    arriving a median 60 s after the previous turn. Chats stop at `max_context_tokens`.
    Like a window cut from a running service, chats start from `warmup_s` before the window
    and only requests inside [0, duration_s) are kept (their parents may lie outside).
    """

    seed: int = 0
    duration_s: float = 3600.0
    warmup_s: float = 1800.0
    chat_rate_per_s: float = 1.0
    mean_turns: float = 3.0
    max_turns: int = 40
    type_probabilities: tuple[float, ...] = (0.6, 0.2, 0.1, 0.1)
    system_prompt_tokens: int = 45
    search_context_median_tokens: float = 2000.0
    file_context_median_tokens: float = 6000.0
    image_tokens_range: tuple[int, int] = (800, 1600)
    message_median_tokens: float = 60.0
    output_median_tokens: float = 250.0
    turn_gap_median_s: float = 60.0
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
        gaps = _lognormal(rng, spec.turn_gap_median_s * 1000, 1.0, k, 2000, 3_600_000) / 1000
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
