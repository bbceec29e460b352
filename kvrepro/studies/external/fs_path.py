"""LMCache's filesystem L2 path in the twin, and the fit of its two constants.

A chunk read back from LMCache's multi-process `fs` adapter goes through two stages:

1. the read of its file: `reads_in_flight` reads at once (io_concurrency), each taking
   `fs_read_latency_s`, no faster than the device (`device_read_gb_s` of the case);
2. staging into LMCache's L1 and on to the GPU, one chunk after another at
   `lmcache_mp_staging_gb_s`: the serial stage the PR 4366 measurements show (at 16 reads in
   flight a 24 MiB chunk still costs ~3.4 ms where the device alone would take ~1).

The twin's store reads chunk by chunk, the latency over reads in flight plus the chunk over
its read rate, so the stages are in series: read rate = 1 / (1 / device + 1 / staging).

Neither constant is stated anywhere, so both are fitted on declared points of the LMCache
case (`used_in_fit`: 65,536 tokens, io_concurrency 1 and 16), every other point predicted.
The hot TTFT is linear in both: per chunk, a_c = latency / c + chunk / staging over the same
run at zero latency and unlimited staging, so the two points give both.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from kvrepro.calc.gpu_rates import Constant, Constants, load_constants
from kvrepro.studies.external.case import load_case, resolve_case
from kvrepro.studies.external.experiments import EXPERIMENTS, CaseRun, key
from kvrepro.studies.external.server_spec import (
    LMCACHE_CHUNK_TOKENS,
    case_server,
    reads_in_flight,
)

FS_FIT_CASE = "lmcache_fs_l2_qwen3coder"
UNLIMITED_GB_S = 1e9
"""A staging rate that takes no time, for the fit's reference run."""


def _per_chunk_s(case, src: Path, point, constants: Constants) -> tuple[float, int, int]:
    """(published - twin at zero latency and free staging) per chunk, reads in flight and
    chunks, at one fit point."""
    one = case.model_copy(update={"workload": case.workload.model_copy(
        update={"prompt_tokens": [int(point.point)]})})
    with tempfile.TemporaryDirectory() as tmp:
        run = CaseRun(one, src.parent, case_server(one, constants), constants, Path(tmp))
        base_s = EXPERIMENTS[one.workload.kind](run)[key(point.metric, point.tier,
                                                           point.point)]
    chunks = int(point.point) // LMCACHE_CHUNK_TOKENS
    in_flight = reads_in_flight(case.setup.tiers[point.tier].stores[0], case)
    return (point.value - base_s) / chunks, in_flight, chunks


def fit_fs_path() -> dict[str, Constant]:
    """`fs_read_latency_s` and `lmcache_mp_staging_gb_s` from the case's two fit points."""
    src = resolve_case(FS_FIT_CASE)
    case = load_case(src)
    points = [p for p in case.published if p.used_in_fit]
    if len({reads_in_flight(case.setup.tiers[p.tier].stores[0], case) for p in points}) != 2:
        raise ValueError(f"{src}: the fs fit needs two used_in_fit points at two read "
                         f"concurrencies, got {[(p.tier, p.point) for p in points]}")
    constants = load_constants()
    constants.constants.update(
        fs_read_latency_s=Constant(value=0.0, unit="s", kind="fitted", source=""),
        lmcache_mp_staging_gb_s=Constant(value=UNLIMITED_GB_S, unit="GB/s", kind="fitted",
                                         source=""))
    (a1, c1, n1), (a2, c2, _) = sorted((_per_chunk_s(case, src, p, constants)
                                        for p in points), key=lambda t: t[1])
    latency_s = (a1 - a2) / (1 / c1 - 1 / c2)
    staging_s = a1 - latency_s / c1
    chunk_bytes = LMCACHE_CHUNK_TOKENS * case.setup.model_spec().kv_bytes_per_token
    where = ", ".join(f"{p.tier} {p.value:g} s" for p in points)
    how = (f"{FS_FIT_CASE} at {points[0].point:g} tokens ({where}): per chunk "
           f"{a1 * 1e3:.3f} ms at {c1} read(s) in flight, {a2 * 1e3:.3f} ms at {c2}, over the "
           f"twin at zero latency and free staging")
    return {
        "fs_read_latency_s": Constant(value=latency_s, unit="s per chunk-file read",
                                      kind="fitted", fit_case=FS_FIT_CASE,
                                      source=how + "; latency = (a1 - a2) / (1/c1 - 1/c2)"),
        "lmcache_mp_staging_gb_s": Constant(
            value=chunk_bytes / staging_s / 1e9, unit="GB/s", kind="fitted",
            fit_case=FS_FIT_CASE,
            source=how + f"; staging = {chunk_bytes / 2**20:g} MiB chunk / (a1 - latency / c1)"),
    }
