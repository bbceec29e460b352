"""Endurance of a flash tier from its write traffic: measured, simulated or traced.

A flash KV tier is rewritten all day, so whether a drive lasts depends on the write rate it
really sees. Three ways to get that rate, one way to turn it into drive writes per day and
years to the rated endurance (`kvrepro.calc.endurance`):

* `write_rate_from_fio`: what a fio write point sustained (the drive's ceiling: the most
  this tier could ever write);
* `write_rate_from_samples`: the simulator's per-store write accounting
  (`<store>_bytes_written` in the server samples of `kvrepro.engines.sim.simulate`);
* `write_rate_from_volume`: a trace's write volume over its duration
  (`kvrepro.analysis.block_traces.write_volume`).

`endurance_from_write_rate` then gives, for a drive (capacity, NAND preset or P/E cycles and
WAF, warranty) and a RAID layout: DWPD seen per drive, rated DWPD, TBW and years to the
rated endurance.
"""

from __future__ import annotations

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from kvrepro._checks import positive
from kvrepro.calc import endurance


class DriveModel(BaseModel):
    """A drive's endurance rating: a NAND preset, or its own P/E cycles, WAF and window."""

    model_config = ConfigDict(extra="forbid")

    capacity_bytes: float = Field(gt=0, description="user capacity per drive, bytes")
    nand: str | None = Field("TLC", description="preset in data/hardware/nand_presets.csv "
                                                "(None: give pe_cycles, waf, rating_days)")
    pe_cycles: float | None = Field(None, gt=0, description="program/erase cycles")
    waf: float | None = Field(None, gt=0, description="write amplification factor")
    rating_days: float | None = Field(None, gt=0, description="days the TBW is rated over")
    warranty_years: float = Field(5.0, gt=0, description="warranty the DWPD rating spans")

    def rating(self) -> tuple[float, float, float]:
        """(P/E cycles, WAF, rating days): the preset's, overridden by any given field."""
        preset = {"pe_cycles": None, "waf": None, "rating_days": None}
        if self.nand is not None:
            table = endurance.nand_presets().set_index("name")
            if self.nand not in table.index:
                raise ValueError(f"unknown NAND preset {self.nand!r} (parameter 'nand'); "
                                 f"known: {list(table.index)}")
            preset = table.loc[self.nand, ["pe_cycles", "waf", "rating_days"]].to_dict()
        values = [getattr(self, k) if getattr(self, k) is not None else preset[k]
                  for k in ("pe_cycles", "waf", "rating_days")]
        if any(v is None for v in values):
            raise ValueError("a drive without a NAND preset needs pe_cycles, waf and "
                             "rating_days")
        return float(values[0]), float(values[1]), float(values[2])


def endurance_from_write_rate(write_rate_bytes_s: float, drive: DriveModel,
                              n_drives: int = 1, raid_level: str | int = "RAID0",
                              source: str = "") -> dict[str, float | str]:
    """DWPD per drive, rated DWPD, TBW and years to rated endurance at a host write rate.

    Rated DWPD = TBW / (capacity x rating days), TBW = P/E x capacity / WAF; years =
    warranty x rated / used DWPD (`kvrepro.calc.endurance`).
    """
    pe_cycles, waf, rating_days = drive.rating()
    tbw = endurance.tbw_bytes(pe_cycles, drive.capacity_bytes, waf)
    rated = endurance.rated_dwpd(tbw, drive.capacity_bytes, rating_days)
    used = endurance.dwpd_from_write_rate(write_rate_bytes_s, n_drives, drive.capacity_bytes,
                                          raid_level)
    return {"source": source, "write_rate_bytes_s": float(write_rate_bytes_s),
            "raid_level": endurance.normalize_raid_level(raid_level), "n_drives": n_drives,
            "drive_capacity_bytes": drive.capacity_bytes, "nand": drive.nand or "custom",
            "dwpd_used": used, "dwpd_rated": rated, "tbw_bytes": tbw,
            "years_to_rated_endurance": endurance.years_to_rated_endurance(
                used, rated, drive.warranty_years)}


def write_rate_from_fio(sweep: pd.DataFrame, block_size_bytes: int | None = None) -> float:
    """The highest write bandwidth of a sweep (optionally at one request size), B/s."""
    rows = sweep[sweep.direction == "write"]
    if block_size_bytes is not None:
        rows = rows[rows.block_size_bytes == block_size_bytes]
    if rows.empty:
        raise ValueError("the sweep has no write point" + (
            f" at block size {block_size_bytes}" if block_size_bytes else ""))
    return float(rows.bw_bytes_s.max())


def write_rate_from_samples(samples: pd.DataFrame, store: str, warmup_s: float = 0.0) -> float:
    """Average write rate into simulator store `store` after `warmup_s`, B/s.

    Uses the cumulative `<store>_bytes_written` counter of the server samples.
    """
    column = f"{store}_bytes_written"
    if column not in samples.columns:
        known = sorted(c.removesuffix("_bytes_written") for c in samples.columns
                       if c.endswith("_bytes_written"))
        raise ValueError(f"no store {store!r} in the samples; stores: {known}")
    window = samples[samples.time_s >= warmup_s].sort_values("time_s")
    if len(window) < 2:
        raise ValueError(f"need two samples after warmup_s={warmup_s} to get a rate")
    span_s = window.time_s.iloc[-1] - window.time_s.iloc[0]
    return float((window[column].iloc[-1] - window[column].iloc[0]) / span_s)


def write_rate_from_volume(write_bytes: float, duration_s: float) -> float:
    """Average write rate of a trace: bytes written over the time it covers, B/s."""
    positive(write_bytes=write_bytes, duration_s=duration_s)
    return write_bytes / duration_s


__all__ = ["DriveModel", "endurance_from_write_rate", "write_rate_from_fio",
           "write_rate_from_samples", "write_rate_from_volume"]
