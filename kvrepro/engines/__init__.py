"""The two engines that serve a workload on a tier of a server spec.

* `live`: real vLLM servers (+ LMCache where a tier needs it), driven over HTTP;
* `sim`: the digital twin of the same server, a discrete-event model;
* `run_result`: what both return (`RunResult`) and the end-of-run rule both follow;
* `send_rule`: when a session's next turn is sent, the one rule both use;
* `tiny_model`: the locally written tiny Llama that the live engine serves on CPUs and the
  simulator's CPU profile is fitted to.

`run("sim" | "live", workload, server, tier, run_dir, ...)` picks one; neither engine imports
the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvrepro.engines.run_result import RunResult
from kvrepro.tier_spec import ServerSpec
from kvrepro.workload.base import Workload

ENGINES = ("live", "sim")


def run(engine: str, workload: Workload, server: ServerSpec, tier: str,
        run_dir: str | Path | None = None, **options: Any) -> RunResult:
    """Run `workload` on tier `tier` of `server` with the named engine (see `run_result`)."""
    if engine == "sim":
        from kvrepro.engines.sim.campaign import run as run_sim

        return run_sim(workload, server, tier, run_dir, **options)
    if engine == "live":
        from kvrepro.engines.live.runner import run as run_live

        if run_dir is None:
            raise ValueError("engine 'live' needs a run_dir (a live run always writes one)")
        return run_live(workload, server, tier, run_dir, **options)
    raise ValueError(f"unknown engine {engine!r} (parameter 'engine'); known: {list(ENGINES)}")


__all__ = ["ENGINES", "RunResult", "run"]
