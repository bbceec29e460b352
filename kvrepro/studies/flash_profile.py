"""A measured flash drive in the twin: `kvrepro.storage.profile`'s numbers put into a simulator
profile, and study B's tiers built from one measured drive.

`kvrepro.storage.profile` turns a fio sweep into a flash store's parameters and knows neither
the simulator nor a study; this module, above both, applies them:

* `apply_flash_profile`: a copy of any simulator profile whose named store(s) take the
  measured bandwidths and latencies (what `kvrepro run sim --flash-profile` does);
* `studyb_measured_profile`: study B's SSDx1..x4 and OPT tiers from one measured drive, for
  the B6 comparison (notebook 11); `b6_for_slow_writes` lets a slow drive's writes keep up
  with B6's spacing (`B6_GAP_S`).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvrepro.engines.sim.config import SimProfile
from kvrepro.storage.profile import MeasuredFlashProfile, series_bw
from kvrepro.studies.study_b import B6_GAP_S
from kvrepro.workload.benchmarks import MicrobenchSpec


def _store_names(profile: SimProfile) -> list[str]:
    return sorted({s.name for t in profile.tiers.values() for s in t.stores})


def apply_flash_profile(profile: SimProfile, measured: MeasuredFlashProfile,
                        store: str | Sequence[str] = "flash") -> SimProfile:
    """A copy of `profile` whose offload store(s) named `store` take the measured values.

    Only bandwidths and per-chunk latencies change (`TIER_FIELDS`); capacity, chunk size and
    eviction stay. The store's chunk must be the chunk that was measured (same bytes), or
    the latencies would belong to another I/O size: the error says what to measure instead.
    """
    names = [store] if isinstance(store, str) else list(store)
    kv_bytes = profile.server.model_spec().kv_bytes_per_token
    tree = profile.model_dump()
    hits = 0
    for tier in tree["tiers"].values():
        for node in tier["stores"]:
            if node["name"] not in names:
                continue
            chunk = node["chunk_tokens"] * kv_bytes
            if chunk != measured.chunk_bytes:
                raise ValueError(
                    f"store {node['name']!r} holds chunks of {chunk:,} B ({node['chunk_tokens']}"
                    f" tokens x {kv_bytes:,} B), the measured profile chunks of "
                    f"{measured.chunk_bytes:,} B ({measured.chunk_tokens} tokens of "
                    f"{measured.model}); measure again with that model and chunk size")
            node.update(measured.tier_fields())
            hits += 1
    if not hits:
        raise ValueError(f"no offload store named {names} in this profile; its stores: "
                         f"{_store_names(profile)} (choose one with --flash-store / store=)")
    return SimProfile.model_validate(tree)


def studyb_measured_profile(profile: SimProfile, measured: MeasuredFlashProfile,
                            drive_counts: Sequence[int] = (1, 2, 3, 4)) -> SimProfile:
    """Study B's profile with its SSD tiers built from one measured drive.

    Like `data/servers/study_b.yaml` does with datasheet drives: SSDxN reads at n x the
    measured bandwidth in series with the host path (the MEM tier's rate), one chunk in
    flight, plus the measured per-chunk latency (samples included); OPT reads at
    min(4 x measured, host path) and keeps the study's own per-chunk cost (the part of its
    pipeline io_uring does not hide, 512-token chunks). Drive counts scale linearly: an
    assumption, unless several drives were measured (B5's targets panel says how they do).
    """
    mem = profile.tiers["mem"].stores[0]
    out = profile
    for n in drive_counts:
        one = measured.model_copy(update={
            "read_bw_bytes_s": series_bw(n * measured.read_bw_bytes_s, mem.read_bw_bytes_s),
            "write_bw_bytes_s": series_bw(n * measured.write_bw_bytes_s, mem.write_bw_bytes_s)})
        out = apply_flash_profile(out, one, store=f"ssd{n}")
    tree = out.model_dump()
    opt = tree["tiers"]["opt"]["stores"][0]
    opt["read_bw_bytes_s"] = min(4 * measured.read_bw_bytes_s, mem.read_bw_bytes_s)
    opt["write_bw_bytes_s"] = min(4 * measured.write_bw_bytes_s, mem.write_bw_bytes_s)
    return SimProfile.model_validate(tree)


def b6_for_slow_writes(profile: SimProfile, spec: MicrobenchSpec | None = None,
                       margin: float = 1.2) -> tuple[SimProfile, MicrobenchSpec]:
    """B6 made to measure loads on a drive that writes more slowly than the study's.

    B6 needs every fill-round prompt on the tier when it is measured. A slow drive's write
    queue would hold more than `max_write_backlog_s` of one long prompt's chunks, and the
    simulator drops writes past that (as LMCache skips a put when its buffer is full): the
    measure round would find part of the prompt missing. So the backlog limit is raised to
    the longest prompt's write time, and requests are spaced so those writes end before the
    next request. Each request runs alone either way: no TTFT changes, only whether the
    prompt is there. Returns (profile, spec), both unchanged when the drives keep up.
    """
    spec = spec or MicrobenchSpec(gap_s=B6_GAP_S)
    kv_bytes = profile.server.model_spec().kv_bytes_per_token
    tree = profile.model_dump()
    need_s = 0.0
    for tier in tree["tiers"].values():
        for store in tier["stores"]:
            chunks = -(-max(spec.prompt_lengths) // store["chunk_tokens"])
            write_s = chunks * margin * (store["chunk_tokens"] * kv_bytes
                                         / store["write_bw_bytes_s"]
                                         + store["chunk_write_latency_s"])
            store["max_write_backlog_s"] = max(store["max_write_backlog_s"], write_s)
            need_s = max(need_s, write_s)
    gap_s = max(spec.gap_s, need_s)
    spec = spec.model_copy(update={"gap_s": gap_s, "round_gap_s": max(spec.round_gap_s, gap_s)})
    return SimProfile.model_validate(tree), spec


__all__ = ["apply_flash_profile", "b6_for_slow_writes", "studyb_measured_profile"]
