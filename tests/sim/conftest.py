"""Fixtures of the simulator tests: the small test profile and a small agentic workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrepro.engines.sim import SimProfile, load_profile
from kvrepro.workload import AgenticSpec, generate_agentic
from kvrepro.workload.base import Workload

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


@pytest.fixture(scope="session")
def profile() -> SimProfile:
    return load_profile(PROFILE_PATH)


@pytest.fixture(scope="session")
def workload() -> Workload:
    return generate_agentic(small_spec())
