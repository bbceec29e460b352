"""What every offload store kind shares: the twin's model of a store, and the questions each
kind answers for the engines, the cost model and the preflight.

Why one class per kind with these methods: a kind used to be a string compared in nine
files (the spec's rules, the live renderings, the twin, the bill, the doctor, validation's
read-back), so a new kind touched all of them. Now a kind module (`dram.py`, `flash.py`,
`shared_fs.py`) owns its fields, its rules, its speed `level` and every rendering; the
consumers loop over a tier's stores and ask each one. The answers are plain data (LMCache
keys, vLLM extra config, twin fields, bill items), so this layer imports no engine.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, model_validator

GIB = 2**30
"""LMCache and vLLM count their sizes in GiB (2**30 bytes); the spec in decimal bytes. The
conversion happens only in the renderings below (`gib`) and in their inverse."""

RUN_DIR = "{run_dir}"
"""Placeholder of a store folder inside its run's own folder, filled in at deployment (never
a fixed path that two runs, or a run and a user, would share)."""


def gib(size_bytes: float) -> float:
    """`size_bytes` in GiB, as LMCache's and vLLM's size settings take it."""
    return size_bytes / GIB


class StrictModel(BaseModel):
    """Every spec model: no unknown keys, and no inf or NaN in a number. Why finite: each
    number of a server is a size, a time, a rate or a count, and `dram_gb=inf` went through
    to an OverflowError in the twin and `Infinity` in a live dry run's LMCache settings."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StoreModel(StrictModel):
    """What an offload store holds, how it evicts, and the twin's model of its channels (the
    simulator's `OffloadTier` is this plus the tier's chunk size)."""

    name: str = Field(min_length=1, description="dram, staging, flash, ...")
    capacity_bytes: float = Field(ge=0, description="bytes of KV it holds (0: holds nothing)")
    eviction: Literal["lru", "ttl", "none"] = Field(
        "lru", description="lru (LMCache's default); ttl (expire after ttl_s unused, LRU when "
                           "full; simulator only); none (when full, keep what it holds and "
                           "store nothing new)")
    ttl_s: float | None = Field(None, gt=0, description="lifetime since last use (ttl only)")
    read_bw_bytes_s: float | None = Field(gt=0, description="twin: load bandwidth into the "
                                          "engine, B/s (None: derived from the server's "
                                          "hardware, the host DMA rate)")
    write_bw_bytes_s: float | None = Field(gt=0, description="twin: store bandwidth, B/s "
                                           "(None: the host DMA rate, as for reads)")
    chunk_read_latency_s: float | None = Field(0.0, ge=0, description="twin: added per chunk "
                                               "read (None: derived from the server's "
                                               "hardware, the disk path's read latency)")
    chunk_write_latency_s: float = Field(0.0, ge=0, description="twin: added per chunk written")
    chunk_read_latency_samples_s: list[NonNegativeFloat] = Field(
        default_factory=list, description="twin: measured per-chunk read latencies (fio flash "
                                          "profile); each chunk read draws one instead of "
                                          "chunk_read_latency_s")
    latency_seed: int = Field(0, ge=0, description="twin: seed of those draws, with the name")
    max_write_backlog_s: float = Field(5.0, gt=0, description="twin: a write that would wait "
                                       "longer than this in the write queue is dropped "
                                       "(and counted)")
    async_eviction: bool | None = Field(
        None, description="twin: LMCache's multi-process eviction (a loop that, every second, "
                          "evicts a fifth of the chunks, LRU first, once the store is 80 % "
                          "full; a full DRAM store drops new chunks, a disk store overshoots "
                          "its limit); false: the LRU chunk is evicted on insert (in-process "
                          "LMCache); None: as the server's live.lmcache_mode")

    @model_validator(mode="after")
    def _ttl_given(self) -> StoreModel:
        if self.eviction == "ttl" and self.ttl_s is None:
            raise ValueError(f"store {self.name!r}: eviction 'ttl' needs ttl_s")
        return self


class StoreBill(BaseModel):
    """What one store adds to a server's hardware (`kvrepro.calc.economics` prices it)."""

    model_config = ConfigDict(extra="forbid")

    dram_bytes: float = 0.0
    drives: int = 0
    drive_tb: float = 12.8
    raid_level: str = "RAID10"
    shared_fs_bytes: float = Field(0.0, description="this server's share of a shared "
                                   "filesystem's capacity")


class StoreFolder(BaseModel):
    """A folder a live store writes chunk files into: the deployer owns it for the run
    (`kvrepro.engines.live.ownership.DiskFolder`) and the doctor checks it."""

    model_config = ConfigDict(extra="forbid")

    store: str = Field(description="the store's name")
    path: str = Field(description="the folder; `{run_dir}` is the run's own folder")
    keep_files: bool = False
    allow_existing_files: bool = False
    shared: bool = Field(False, description="one folder for every instance of a fleet")


class FolderFiles(StrictModel):
    """What a store that writes chunk files into a folder lets the user decide about them."""

    keep_files: bool = Field(False, description="live: leave the chunk files the run wrote in "
                             "the folder (default: the run removes exactly those)")
    allow_existing_files: bool = Field(False, description="live: serve from a folder that "
                                       "already holds files (refused by default: they would "
                                       "be mixed with this run's, and be hits)")


class StoreBase(StoreModel):
    """One offload store of a server spec. A kind subclasses it, sets `kind` (its registry
    key), `level` and the class flags, and overrides the renderings it has."""

    kind: str
    level: ClassVar[int]
    """Speed order, 0 fastest: a tier's stores are listed in increasing level."""
    l1: ClassVar[bool] = False
    """May be LMCache's first level (its DRAM L1; multi-process LMCache needs one)."""
    hard_limit: ClassVar[bool] = True
    """Twin: when full, new chunks are dropped (LMCache's L1); False: a soft limit that
    writes overshoot until the eviction loop catches up (its fs_native disk tier)."""
    shared: ClassVar[bool] = False
    """One store for every instance of a fleet (a shared filesystem), not one each."""
    host_memory: ClassVar[bool] = False
    """Holds its chunks in the host's DRAM, moved to and from the GPU by pinned DMA: a
    server with `hardware` derives its open rates from that (`kvrepro.calc.gpu_rates`)."""

    def where(self) -> str:
        return f"store {self.name!r} ({self.kind})"

    def folder(self) -> StoreFolder | None:
        """The folder the store's chunk files go to (None: it writes no files)."""
        return None

    def lmcache_in_process(self) -> dict[str, Any]:
        """Its keys of in-process LMCache's `LMCacheSettings` (sizes in GiB)."""
        raise ValueError(f"{self.where()}: no in-process LMCache backend")

    def lmcache_l2_adapter(self) -> dict[str, Any]:
        """Its `lmcache server --l2-adapter` JSON (multi-process LMCache, below the L1)."""
        raise ValueError(f"{self.where()}: no multi-process LMCache L2 adapter")

    def native_offload(self) -> dict[str, Any]:
        """Its part of vLLM's own offloading (`OffloadingConnector` extra config)."""
        raise ValueError(f"{self.where()}: vLLM's native offloading has no such store")

    @classmethod
    def deployed_capacity_bytes(cls, lmcache_mp: dict[str, Any], position: int
                                ) -> float | None:
        """The inverse of the multi-process rendering: the capacity a run deployed this store
        with, read from its recorded `lmcache_mp` settings (None: not recorded there)."""
        return None

    def twin_store(self) -> dict[str, Any]:
        """The twin's view: `StoreModel`'s fields as the simulator's `OffloadTier` takes them,
        its kind (what a validation reads a run's sizes back by) and whether it is a hard
        limit."""
        return {**self.model_dump(include=set(StoreModel.model_fields)),
                "kind": self.kind, "hard_limit": self.hard_limit}

    def bill(self) -> StoreBill:
        """What the store adds to the server's hardware."""
        return StoreBill()

    def check_eviction_rendered(self) -> None:
        """A live rendering of a store whose eviction LMCache does not have is refused."""
        if self.eviction != "lru":
            raise ValueError(f"{self.where()}: eviction {self.eviction!r} has no LMCache "
                             "setting (LMCache evicts LRU); it is a simulator what-if")


KINDS: dict[str, type[StoreBase]] = {}
"""The registry: kind name -> its store class (`register`)."""


def register(cls: type[StoreBase]) -> type[StoreBase]:
    """Add a kind's store class to `KINDS` under its `kind` literal (a class decorator)."""
    kind = cls.model_fields["kind"].default
    if not isinstance(kind, str) or kind in KINDS:
        raise ValueError(f"{cls.__name__}: kind {kind!r} is missing or registered twice")
    KINDS[kind] = cls
    return cls
