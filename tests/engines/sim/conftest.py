"""Fixtures of the simulator tests: the small test profile and a small agentic workload."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kvrepro.engines.sim import SimProfile, load_profile
from kvrepro.engines.sim.config import OffloadTier
from kvrepro.workload import AgenticSpec, generate_agentic
from kvrepro.workload.base import TURN_COLUMNS, SeededTokens, Workload

PROFILE_PATH = Path(__file__).with_name("profile_small.yaml")


def small_spec(**overrides: object) -> AgenticSpec:
    """Agentic sessions shrunk to the test profile: 8K contexts, short turns, 10 minutes."""
    params = dict(seed=1, session_rate_per_min=6, duration_s=600, warmup_s=30,
                  context_cap_tokens=8192, tool_tokens=(100, 300), file_tokens=(800, 1500),
                  short_output_tokens=(20, 80), code_tokens=(150, 300), jitter_tokens=20,
                  idle_after_turns=6, idle_after_jitter_turns=1, idle_s=120, idle_jitter_s=10,
                  p_returning=0.2)
    params.update(overrides)
    return AgenticSpec(**params)


def table_workload(rows: list[tuple], arrivals: dict[int, float]) -> Workload:
    """A hand-made workload. Rows of (session, turn, pause_s, not_before_s, append_tokens,
    output_tokens); `arrivals` maps session -> arrival_s."""
    turns = pd.DataFrame(rows, columns=["session_id", "turn", "pause_s", "not_before_s",
                                        "append_tokens", "output_tokens"])
    turns["prompt_tokens"] = turns.groupby("session_id").append_tokens.cumsum()
    turns["is_resume"], turns["append_kind"], turns["output_kind"] = False, "tool", "short"
    turns = turns[list(TURN_COLUMNS)].astype(TURN_COLUMNS)
    sessions = pd.DataFrame({"session_id": list(arrivals), "arrival_s": list(arrivals.values())})
    sessions["n_turns"] = sessions.session_id.map(turns.groupby("session_id").size())
    sessions["cohort"], sessions["is_warmup"], sessions["end_reason"] = "normal", False, "cap"
    return Workload({"kind": "table"}, sessions, turns, SeededTokens(seed=3))


KV_BYTES = 1000  # per token, of the hand-made offload stores
CHUNK = 4  # tokens per chunk
CHUNK_BYTES = CHUNK * KV_BYTES


def offload_tier(name: str = "dram", chunks: int = 3, **kw: object) -> OffloadTier:
    """A small offload store of `chunks` chunks of CHUNK tokens, 1 MB/s each way."""
    params = dict(name=name, capacity_bytes=chunks * CHUNK_BYTES, read_bw_bytes_s=1e6,
                  write_bw_bytes_s=1e6, chunk_tokens=CHUNK)
    params.update(kw)
    return OffloadTier(**params)


@pytest.fixture(scope="session")
def profile() -> SimProfile:
    return load_profile(PROFILE_PATH)


@pytest.fixture(scope="session")
def workload() -> Workload:
    return generate_agentic(small_spec())
