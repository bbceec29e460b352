"""Workloads: the load every engine and tier runs, generated once from a seed.

* `base`: the `Workload` tables, token sources, save/load, summary;
* `agentic`: study A's agentic sessions with returning users;
* `studyb`: study B's microbenchmark and multi-turn macrobenchmark;
* `traces`: Mooncake / Qwen-Bailian block-hash trace replay.
"""

from kvrepro.workload.agentic import AgenticSpec, PauseSpec, generate_agentic, resumes_in_window
from kvrepro.workload.base import Workload, load_workload, save_workload, summarize

# Imported for their token-source registrations ("block_hash", "keyed"), which
# `load_workload` needs to rebuild trace and microbenchmark workloads.
from kvrepro.workload.studyb import MacrobenchSpec, MicrobenchSpec, macrobenchmark, microbenchmark
from kvrepro.workload.traces import read_block_trace, trace_to_workload

__all__ = ["AgenticSpec", "MacrobenchSpec", "MicrobenchSpec", "PauseSpec", "Workload",
           "generate_agentic", "load_workload", "macrobenchmark", "microbenchmark",
           "read_block_trace", "resumes_in_window", "save_workload", "summarize",
           "trace_to_workload"]
