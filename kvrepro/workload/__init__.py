"""Workloads: the load every engine and tier runs, generated once from a seed.

* `base`: the `Workload` tables, token sources, save/load, summary;
* `agentic`: agentic sessions with returning users (study A's shape, `kvrepro.studies.study_a`);
* `benchmarks`: the prompt-caching microbenchmark and the multi-turn (QPS) benchmark;
* `shared_prefix`: inference-perf's shared-prefix benchmark under Poisson stages;
* `trace_replay`: Mooncake / Qwen-Bailian block-hash trace replay.

The synthetic stand-ins for data the studies read (Qwen-Bailian traceA, Claude Code telemetry)
are in `kvrepro.studies`.
"""

from kvrepro.workload.agentic import AgenticSpec, PauseSpec, generate_agentic, resumes_in_window
from kvrepro.workload.base import Workload, load_workload, save_workload, summarize

# Imported for their token-source registrations ("block_hash", "keyed"), which
# `load_workload` needs to rebuild trace and microbenchmark workloads.
from kvrepro.workload.benchmarks import (
    MacrobenchSpec,
    MicrobenchSpec,
    macrobenchmark,
    microbenchmark,
)
from kvrepro.workload.shared_prefix import SharedPrefixSpec, shared_prefix_workload
from kvrepro.workload.trace_replay import read_block_trace, trace_to_workload

__all__ = ["WORKLOAD_KINDS", "AgenticSpec", "MacrobenchSpec", "MicrobenchSpec", "PauseSpec",
           "Workload", "build_workload", "generate_agentic", "load_workload", "macrobenchmark",
           "microbenchmark", "read_block_trace", "resumes_in_window", "save_workload",
           "SharedPrefixSpec", "shared_prefix_workload", "summarize", "trace_to_workload"]

WORKLOAD_KINDS = ("agentic", "micro", "macro")


def build_workload(kind: str, params: dict | None = None) -> Workload:
    """Generate a workload by kind ("agentic", "micro", "macro") from spec parameters.

    The parameters are validated by the kind's spec (a misspelled key is an error naming it).
    """
    params = params or {}
    if kind == "agentic":
        return generate_agentic(AgenticSpec(**params))
    if kind == "micro":
        return microbenchmark(MicrobenchSpec(**params))
    if kind == "macro":
        return macrobenchmark(MacrobenchSpec(**params))
    raise ValueError(f"unknown workload kind {kind!r} (parameter 'workload'); "
                     f"known: {list(WORKLOAD_KINDS)}")
