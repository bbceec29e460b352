"""A measured flash tier: a fio sweep turned into a flash store's model parameters.

A store's model (`kvrepro.tier_spec.StoreModel`, which the simulator's offload store
renders) reads a chunk in `chunk_bytes / read_bw_bytes_s + chunk_read_latency_s`. From
measurements:

* `read_bw_bytes_s` / `write_bw_bytes_s`: fio's bandwidth at the chosen request size and I/O
  depth (default: chunk-sized requests at the depth that read fastest), one job, one target;
* per-chunk read latency: each chunk-sized read (B9, one at a time) minus the transfer time
  at that bandwidth, so a chunk read alone takes in the simulator what it took on the drive.
  The median is `chunk_read_latency_s`; every chunk's value goes to
  `chunk_read_latency_samples_s` (drawn per chunk read). A read faster than the bandwidth
  predicts counts as 0 (the simulator has no negative latency): `n_clipped` says how many;
* `chunk_write_latency_s`: the same from a chunk-sized write at I/O depth 1 (fio's mean).

`save_flash_profile` writes that with its provenance (fio version, targets, date, request
size, depth, engine) as YAML; `MeasuredFlashProfile.tier_fields` are the store-model fields
it sets. `dram_chunk_copy_times` times the DRAM side of B9. Nothing here knows the
simulator or a study: putting a profile into a simulator profile (`kvrepro run sim
--flash-profile`) and building study B's tiers from one measured drive are done above, with
the studies (`flash_profile`).
"""

from __future__ import annotations

import datetime as dt
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, ValidationError

from kvrepro._checks import load_yaml

FORMAT = "kvrepro-flash-profile/1"
TIER_FIELDS = ("read_bw_bytes_s", "write_bw_bytes_s", "chunk_read_latency_s",
               "chunk_write_latency_s", "chunk_read_latency_samples_s")
"""The store-model fields (`kvrepro.tier_spec.StoreModel`) a measured profile sets
(capacity, chunking, eviction stay)."""


class FlashProvenance(BaseModel):
    """Where and how the numbers were measured."""

    model_config = ConfigDict(extra="forbid")

    fio_version: str = Field(description="`fio --version` of the run")
    targets: list[str] = Field(description="files or devices measured")
    date_utc: str = Field(description="ISO time of the measurement")
    host: str = Field("", description="machine name")
    block_size_bytes: int = Field(gt=0, description="request size of the bandwidth points")
    iodepth: int = Field(gt=0, description="I/O depth of the bandwidth points")
    numjobs: int = Field(1, gt=0, description="jobs of the bandwidth points")
    engine: str = Field(description="fio ioengine")
    direct: bool = Field(True, description="O_DIRECT")
    chunk_reads: int = Field(ge=0, description="chunk-sized reads behind the latency samples")
    n_clipped: int = Field(0, ge=0, description="chunk reads faster than the bandwidth "
                                                "predicts (latency counted as 0)")
    note: str = Field("", description="anything a reader should know")


class MeasuredFlashProfile(BaseModel):
    """A flash store's parameters as measured, in the simulator's units, with provenance."""

    model_config = ConfigDict(extra="forbid")

    format: str = Field(FORMAT, description="file format tag")
    model: str = Field(description="model whose KV chunk was measured")
    chunk_tokens: int = Field(gt=0, description="tokens per KV chunk")
    chunk_bytes: int = Field(gt=0, description="bytes per KV chunk (= chunk_tokens x KV "
                                               "bytes per token)")
    read_bw_bytes_s: float = Field(gt=0, description="read bandwidth, B/s")
    write_bw_bytes_s: float = Field(gt=0, description="write bandwidth, B/s")
    chunk_read_latency_s: float = Field(ge=0, description="median per-chunk read latency "
                                                          "beyond the transfer time")
    chunk_write_latency_s: float = Field(ge=0, description="per-chunk write latency beyond "
                                                           "the transfer time")
    chunk_read_latency_samples_s: list[NonNegativeFloat] = Field(
        default_factory=list, description="every measured chunk's read latency beyond the "
                                          "transfer time")
    chunk_read_time_p50_s: float = Field(ge=0, description="measured chunk read time, median")
    chunk_read_time_p99_s: float = Field(ge=0, description="measured chunk read time, p99")
    provenance: FlashProvenance

    def tier_fields(self) -> dict[str, Any]:
        """The OffloadTier fields this profile sets."""
        return {name: getattr(self, name) for name in TIER_FIELDS}


# --------------------------------------------------------------------------- DRAM side


def dram_chunk_copy_times(chunk_bytes: int, n_chunks: int = 41,
                          warmup: int = 2) -> pd.DataFrame:
    """Time a numpy copy of one chunk-sized buffer, chunk by chunk (B9's DRAM line).

    Source and destination are touched first (`warmup` copies), so page faults are not
    counted. Columns: chunk_id, time_s, tier ("DRAM").
    """
    if chunk_bytes <= 0 or n_chunks <= 0:
        raise ValueError(f"chunk_bytes ({chunk_bytes}) and n_chunks ({n_chunks}) must be > 0")
    src = np.random.default_rng(0).integers(0, 255, chunk_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    for _ in range(warmup):
        np.copyto(dst, src)
    times = []
    for _ in range(n_chunks):
        start = time.perf_counter_ns()
        np.copyto(dst, src)
        times.append((time.perf_counter_ns() - start) / 1e9)
    return pd.DataFrame({"chunk_id": range(n_chunks), "time_s": times, "tier": "DRAM"})


# --------------------------------------------------------------------------- sweep -> profile


def _bandwidth_row(sweep: pd.DataFrame, rw: str, block_size_bytes: int,
                   iodepth: int | None, engine: str) -> pd.Series:
    """The single-job, single-target sweep row for (rw, bs, depth); best depth if None."""
    rows = sweep[(sweep.rw == rw) & (sweep.block_size_bytes == block_size_bytes)
                 & (sweep.numjobs == 1) & (sweep.n_targets == 1) & (sweep.engine == engine)]
    if iodepth is not None:
        rows = rows[rows.iodepth == iodepth]
    if rows.empty:
        have = sweep[sweep.rw == rw][["block_size_bytes", "iodepth", "engine"]]
        raise ValueError(f"the sweep has no {rw} point at block size {block_size_bytes}, "
                         f"iodepth {iodepth or 'any'}, engine {engine}, 1 job, 1 target; it "
                         f"has {have.drop_duplicates().to_dict('records')}")
    return rows.loc[rows.bw_bytes_s.idxmax()]


def _chunk_write_latency_s(sweep: pd.DataFrame, chunk_bytes: int, write_bw: float,
                           engine: str) -> float:
    """Mean chunk-sized write time at depth 1 beyond the transfer time (0 without one)."""
    try:
        row = _bandwidth_row(sweep, "write", chunk_bytes, 1, engine)
    except ValueError:
        return 0.0
    return max(0.0, row.lat_mean_ns / 1e9 - chunk_bytes / write_bw)


def flash_profile_from_measurements(
        sweep: pd.DataFrame, chunk_reads: pd.DataFrame, *, model: str, chunk_tokens: int,
        chunk_bytes: int, engine: str, fio_version: str, targets: Sequence[str | Path],
        block_size_bytes: int | None = None, iodepth: int | None = None,
        note: str = "") -> MeasuredFlashProfile:
    """A MeasuredFlashProfile from a sweep (`FioBench.sweep`) and chunk reads (B9's SSD side).

    `block_size_bytes` defaults to the chunk size, `iodepth` to the depth that read fastest
    at that size (the drive kept busy, as a tuned reader would); writes use the same size
    and depth. See the module docstring for how latency is derived.
    """
    bs = block_size_bytes or chunk_bytes
    read = _bandwidth_row(sweep, "read", bs, iodepth, engine)
    write = _bandwidth_row(sweep, "write", bs, int(read.iodepth), engine)
    times_s = chunk_reads["time_s"].to_numpy(dtype=float)
    excess_s = times_s - chunk_bytes / read.bw_bytes_s
    samples_s = np.clip(excess_s, 0.0, None)
    provenance = FlashProvenance(
        fio_version=fio_version, targets=[str(t) for t in targets],
        date_utc=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        host=platform.node(), block_size_bytes=bs, iodepth=int(read.iodepth),
        numjobs=1, engine=engine, chunk_reads=len(times_s),
        n_clipped=int((excess_s < 0).sum()), note=note)
    return MeasuredFlashProfile(
        model=model, chunk_tokens=chunk_tokens, chunk_bytes=chunk_bytes,
        read_bw_bytes_s=float(read.bw_bytes_s), write_bw_bytes_s=float(write.bw_bytes_s),
        chunk_read_latency_s=float(np.median(samples_s)),
        chunk_write_latency_s=_chunk_write_latency_s(sweep, chunk_bytes,
                                                     float(write.bw_bytes_s), engine),
        chunk_read_latency_samples_s=[float(v) for v in samples_s],
        chunk_read_time_p50_s=float(np.percentile(times_s, 50)),
        chunk_read_time_p99_s=float(np.percentile(times_s, 99)), provenance=provenance)


def save_flash_profile(profile: MeasuredFlashProfile, path: str | Path) -> Path:
    """Write the measured profile as YAML (read back with `load_flash_profile`)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = ("# Flash tier measured with fio by kvrepro.storage (notebook 11_storage_fio).\n"
              "# Use: kvrepro run sim --profile <profile.yaml> --flash-profile <this file>\n")
    out.write_text(header + yaml.safe_dump(profile.model_dump(), sort_keys=False))
    return out


def load_flash_profile(path: str | Path) -> MeasuredFlashProfile:
    """Read a measured flash profile; errors name the file and the bad field."""
    src = Path(path)
    if not src.is_file():
        raise FileNotFoundError(f"measured flash profile not found: {src}")
    raw = load_yaml(src.read_text(), str(src))
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"{src}: not a measured flash profile (expected format: {FORMAT})")
    try:
        return MeasuredFlashProfile.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(f"field {'.'.join(map(str, e['loc']))}: {e['msg']}"
                             for e in err.errors())
        raise ValueError(f"{src}: invalid measured flash profile: {problems}") from err


# --------------------------------------------------------------------------- drives in series


def series_bw(*bws_bytes_s: float) -> float:
    """Rate of stages a chunk passes one after the other: 1 / sum(1 / bw)."""
    return 1.0 / sum(1.0 / bw for bw in bws_bytes_s)


__all__ = ["FORMAT", "FlashProvenance", "MeasuredFlashProfile", "TIER_FIELDS",
           "dram_chunk_copy_times", "flash_profile_from_measurements", "load_flash_profile",
           "save_flash_profile", "series_bw"]
