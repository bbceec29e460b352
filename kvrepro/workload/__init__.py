"""Workloads: the load every engine and tier runs, generated once from a seed.

* `base`: the `Workload` tables, token sources, save/load, summary;
* `agentic`: study A's agentic sessions with returning users;
* `studyb`: study B's microbenchmark and multi-turn macrobenchmark;
* `traces`: Mooncake / Qwen-Bailian block-hash trace replay.
"""

from kvrepro.workload.agentic import AgenticSpec, PauseSpec, generate_agentic, resumes_in_window
from kvrepro.workload.base import Workload, load_workload, save_workload, summarize

__all__ = ["AgenticSpec", "PauseSpec", "Workload", "generate_agentic", "load_workload",
           "resumes_in_window", "save_workload", "summarize"]
