"""inference-perf's `shared_prefix` workload under Poisson stages, as a block-hash `Workload`.

The llm-d tiered-prefix-cache benchmark drives vLLM with inference-perf's `shared_prefix` data
generator and `poisson` load stages; this module rebuilds that load so the digital twin can
replay it. Source followed: kubernetes-sigs/inference-perf at commit 7de5ef2 (2026-08-19).

Prompts, `inference_perf/datagen/synthetic/shared_prefix_datagen.py`:

* lines 249-270: per group one random system prompt of `system_prompt_len` tokens (line 251),
  and per prompt of the group a fresh random question of `question_len` tokens (line 264);
  the prompt is system prompt + question. Prompts are listed group-major: (group 0, prompt
  0), (0, 1), ..., (1, 0), ...
* lines 288-294: that list is shuffled once, `self.rng.permutation(len(self.prompts))`, with
  `self.rng = np.random.default_rng(shared_prefix.seed)` (line 90).
* lines 185-193 and 153-154: `get_data()` yields data_index 0, 1, 2, ... and request i gets
  prompt `i % len(prompts)`: sequential cycling over the shuffled list, no random choice.
  `inference_perf/loadgen/load_generator.py` line 777 calls `get_data()` afresh in every
  stage, so each stage starts again at the first shuffled prompt.

Stages, `inference_perf/loadgen/load_generator.py` `run_stage` (lines 761-795) and
`inference_perf/loadgen/load_timer.py` `PoissonLoadTimer` (lines 68-97):

* a stage (`rate` QPS, `duration` s) sends exactly int(rate * duration) requests (line 771);
* their times come from the Poisson timer: each 1 s window draws k ~ Poisson(rate) (line 85);
  an empty window just passes (lines 88-90); otherwise `ConstantLoadTimer(k, 1.0)` (lines
  53-65) spreads the k requests over the window with exponential gaps rescaled to sum to 1 s,
  so the k-th lands on the window's end. Arrivals are therefore not exponential inter-arrival
  times overall: counts per second are Poisson, the spacing inside a second is normalised.
* stages run one after another (lines 1030-1091); the next starts once the previous one's
  requests finished, after `interval` (default 1 s, `inference_perf/config/loadgen/config.py`
  line 164) and a 1 s lead-in (line 766).

What kvrepro reproduces, and where it must differ:

* the rules above, with its own seeded generators: inference-perf's timers are unseeded
  (`np.random.default_rng()`, load_timer.py lines 46 and 76) and its shuffle comes after
  tokenizer-dependent token draws from the same generator, so its exact draws cannot be
  replayed. The prompt order here is `default_rng([seed, 0]).permutation`, stage k's times
  come from `default_rng([seed, 1, k])` (changing a later stage leaves earlier ones alone).
* stages back to back: stage k+1 starts where stage k's timer stopped (the end of the last
  1 s window it used) plus `stage_gap_s` (default 0). A twin cannot know the drain time that
  inference-perf waits for; a gap of 2 s matches its default interval plus lead-in.
* prompts are block-hash sequences, as in trace replay: the hash block size is
  gcd(system_prompt_len, question_len) tokens (16000 and 256 give 128), so the sharing
  boundary falls exactly on a block edge. A group's system-prompt hashes are shared by all its
  prompts; a question's hashes belong to its (group, prompt) pair alone. Token ids come from
  `BlockHashTokens` (so a live engine sees the same sharing) and the simulator's "trace"
  rule (`kvrepro.engines.sim.prefix_units`) sees one segment per hash. Small gcds make many
  hashes per prompt (gcd 1: one per token), so pick lengths with a large common divisor.
* fixed lengths only (inference-perf also accepts length distributions).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from kvrepro.workload.base import SESSION_COLUMNS, TURN_COLUMNS, Workload
from kvrepro.workload.trace_replay import BlockHashTokens

GENERATOR = "kvrepro.workload.shared_prefix.shared_prefix_workload"
_VOCAB_SIZE = 32_000
_FIRST_TOKEN_ID = 16


class PoissonStage(BaseModel):
    """One inference-perf `poisson` stage: int(rate_qps * duration_s) requests."""

    model_config = ConfigDict(extra="forbid")

    rate_qps: float = Field(gt=0, allow_inf_nan=False, description="mean requests per second")
    duration_s: float = Field(gt=0, allow_inf_nan=False, description="nominal stage length")


class SharedPrefixSpec(BaseModel):
    """inference-perf's `data.shared_prefix` (fixed lengths) plus its `load.stages`."""

    model_config = ConfigDict(extra="forbid")

    num_groups: int = Field(gt=0, description="distinct system prompts")
    num_prompts_per_group: int = Field(gt=0, description="questions per system prompt")
    system_prompt_len: int = Field(gt=0, description="system prompt tokens (shared in a group)")
    question_len: int = Field(gt=0, description="question tokens (one per (group, prompt))")
    output_len: int = Field(gt=0, description="max tokens generated per request")
    stages: list[PoissonStage] = Field(min_length=1, description="Poisson stages, in order")
    stage_gap_s: float = Field(0.0, ge=0, allow_inf_nan=False,
                               description="idle time between stages (0: back to back)")
    seed: int = Field(0, ge=0, description="seeds the prompt order and every stage's times")


def stage_offsets_s(rate_qps: float, n_requests: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Request times (s from the stage start) of inference-perf's Poisson timer, and how many
    1 s windows it used.

    Window w draws k_w ~ Poisson(rate); its k_w requests sit at w + (cumulative exponential
    gaps / their sum), so the last one is at w + 1. Windows are drawn until n_requests fit.
    """
    if n_requests == 0:
        return np.zeros(0), 0
    counts = _window_counts(rate_qps, n_requests, rng)
    busy = counts[counts > 0]
    gaps = rng.exponential(1.0, size=int(busy.sum()))
    first = np.concatenate([[0], np.cumsum(busy)[:-1]])
    which = np.repeat(np.arange(len(busy)), busy)
    ends = np.cumsum(gaps)
    before = np.concatenate([[0.0], ends])[first]
    fraction = (ends - before[which]) / np.add.reduceat(gaps, first)[which]
    offsets = np.flatnonzero(counts)[which] + np.minimum(fraction, 1.0)
    return offsets[:n_requests], len(counts)


def _window_counts(rate_qps: float, n_requests: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson counts of consecutive 1 s windows, cut after the window holding request n."""
    chunks: list[np.ndarray] = []
    total = 0
    while total < n_requests:
        size = max(16, math.ceil(1.2 * (n_requests - total) / rate_qps))
        chunks.append(rng.poisson(rate_qps, size=size))
        total += int(chunks[-1].sum())
    counts = np.concatenate(chunks)
    last = int(np.searchsorted(np.cumsum(counts), n_requests))
    return counts[: last + 1]


def _arrivals(spec: SharedPrefixSpec) -> tuple[pd.DataFrame, list[float]]:
    """Arrival time, stage number and index within the stage of every request, in order, and
    each stage's start (s)."""
    times, stages, positions, starts = [], [], [], []
    start_s = 0.0
    for k, stage in enumerate(spec.stages):
        starts.append(start_s)
        n = int(stage.rate_qps * stage.duration_s)
        offsets, windows = stage_offsets_s(stage.rate_qps, n,
                                           np.random.default_rng([spec.seed, 1, k]))
        times.append(start_s + offsets)
        stages.append(np.full(n, k, dtype="int64"))
        positions.append(np.arange(n, dtype="int64"))
        start_s += windows + spec.stage_gap_s
    arrivals = pd.DataFrame({"arrival_s": np.concatenate(times),
                             "stage": np.concatenate(stages),
                             "position": np.concatenate(positions)})
    return arrivals, starts


def prompt_hash_table(spec: SharedPrefixSpec) -> tuple[np.ndarray, int]:
    """Block hashes of every (group, prompt) pair, row g * num_prompts_per_group + p, and the
    block size in tokens.

    Group g's system blocks are g * n_sys + j; question blocks are numbered after all system
    blocks, n_q per pair, so no hash is reused except a group's system prompt.
    """
    block_tokens = math.gcd(spec.system_prompt_len, spec.question_len)
    n_sys = spec.system_prompt_len // block_tokens
    n_q = spec.question_len // block_tokens
    n_prompts = spec.num_groups * spec.num_prompts_per_group
    group = np.arange(n_prompts) // spec.num_prompts_per_group
    system = group[:, None] * n_sys + np.arange(n_sys)
    question = (spec.num_groups * n_sys + np.arange(n_prompts)[:, None] * n_q + np.arange(n_q))
    return np.hstack([system, question]).astype("int64"), block_tokens


def prompt_order(spec: SharedPrefixSpec) -> np.ndarray:
    """The shuffled prompt list (rows of `prompt_hash_table`) each stage cycles through."""
    n_prompts = spec.num_groups * spec.num_prompts_per_group
    return np.random.default_rng([spec.seed, 0]).permutation(n_prompts)


def _turns(spec: SharedPrefixSpec, arrivals: pd.DataFrame, hashes: np.ndarray) -> pd.DataFrame:
    """One open-loop turn per request, with its stage, group, prompt and block hashes."""
    order = prompt_order(spec)
    flat = order[arrivals["position"].to_numpy() % len(order)]
    n = len(arrivals)
    prompt_tokens = spec.system_prompt_len + spec.question_len
    turns = pd.DataFrame({
        "session_id": np.arange(n), "turn": 0, "pause_s": 0.0,
        "not_before_s": arrivals["arrival_s"].to_numpy(),
        "append_tokens": prompt_tokens, "output_tokens": spec.output_len,
        "prompt_tokens": prompt_tokens, "is_resume": False,
        "append_kind": "shared_prefix", "output_kind": "shared_prefix",
    }).astype(TURN_COLUMNS)
    turns["stage"] = arrivals["stage"].to_numpy()
    turns["group"] = flat // spec.num_prompts_per_group
    turns["prompt_index"] = flat % spec.num_prompts_per_group
    rows = [tuple(r) for r in hashes.tolist()]
    turns["hash_ids"] = pd.Series([rows[i] for i in flat], dtype=object)
    return turns


def shared_prefix_workload(spec: SharedPrefixSpec) -> Workload:
    """inference-perf's shared-prefix benchmark as an open-loop block-hash workload.

    One session of one turn per request, sent at its arrival time. The spec records every
    parameter, the generator, the hash block size and each stage's start (s); save/load
    rebuilds the token source from it.
    """
    hashes, block_tokens = prompt_hash_table(spec)
    arrivals, stage_start_s = _arrivals(spec)
    turns = _turns(spec, arrivals, hashes)
    sessions = pd.DataFrame({
        "session_id": turns.session_id, "arrival_s": turns.not_before_s, "n_turns": 1,
        "cohort": "shared_prefix", "is_warmup": False, "end_reason": "single_request",
    }).astype(SESSION_COLUMNS)
    tokens_spec = {"kind": "block_hash", "seed": spec.seed, "block_size": block_tokens,
                   "vocab_size": _VOCAB_SIZE, "first_id": _FIRST_TOKEN_ID}
    spec_dict = {"kind": "shared_prefix", "generator": GENERATOR,
                 "params": spec.model_dump(mode="json"), "hash_block_tokens": block_tokens,
                 "n_requests": len(turns), "stage_start_s": stage_start_s,
                 "tokens": tokens_spec}
    tokens = BlockHashTokens(spec.seed, block_tokens, _VOCAB_SIZE, _FIRST_TOKEN_ID, turns=turns)
    return Workload(spec_dict, sessions, turns, tokens)
