"""Flash endurance: drive writes per day (DWPD), rated endurance, and endurance-bound capacity.

A flash KV tier rewrites itself continuously (every generated token writes KV, TTL churn
replaces old entries), so endurance, not capacity, can decide how many drives a tier needs.

Formulas (study B, p10-11; study A, figure A7):
* DWPD from traffic = host write rate x 86,400 s x RAID write factor / (drives x capacity);
* TBW = P/E cycles x capacity / WAF;  rated DWPD = TBW / (capacity x rating days);
* C_bound = daily writes / (number of SSDs x DWPD): the smallest capacity per drive that
  survives the daily write volume.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import pandas as pd

from kvrepro._checks import non_negative, positive
from kvrepro._paths import data_file
from kvrepro.tier_spec import normalize_raid_level, raid_write_factor

SECONDS_PER_DAY = 86_400.0


def dwpd_from_write_rate(write_rate_bytes_s: float, n_drives: int, drive_capacity_bytes: float,
                         raid_level: str | int = "RAID0") -> float:
    """Drive writes per day each drive sees under a sustained host write rate."""
    positive(write_rate_bytes_s=write_rate_bytes_s, n_drives=n_drives,
             drive_capacity_bytes=drive_capacity_bytes)
    factor = raid_write_factor(raid_level, n_drives)
    per_drive_bytes_day = write_rate_bytes_s * SECONDS_PER_DAY * factor / n_drives
    return per_drive_bytes_day / drive_capacity_bytes


def tbw_bytes(pe_cycles: float, capacity_bytes: float, waf: float) -> float:
    """Total bytes the host can write before the NAND's P/E budget is spent."""
    positive(pe_cycles=pe_cycles, capacity_bytes=capacity_bytes, waf=waf)
    return pe_cycles * capacity_bytes / waf


def rated_dwpd(tbw: float, capacity_bytes: float, rating_days: float) -> float:
    """DWPD rating implied by a TBW budget over a rating period."""
    positive(tbw=tbw, capacity_bytes=capacity_bytes, rating_days=rating_days)
    return tbw / (capacity_bytes * rating_days)


def c_bound_bytes(daily_writes_bytes: float, dwpd: float, n_ssds: int = 1) -> float:
    """Smallest per-drive capacity whose DWPD rating survives the daily write volume."""
    non_negative(daily_writes_bytes=daily_writes_bytes)
    positive(dwpd=dwpd, n_ssds=n_ssds)
    return daily_writes_bytes / (n_ssds * dwpd)


def years_to_rated_endurance(dwpd_used: float, dwpd_rated: float,
                             warranty_years: float = 5.0) -> float:
    """Years until a drive written at `dwpd_used` spends a `dwpd_rated` x warranty budget."""
    positive(dwpd_used=dwpd_used, dwpd_rated=dwpd_rated, warranty_years=warranty_years)
    return warranty_years * dwpd_rated / dwpd_used


@lru_cache(maxsize=1)
def nand_presets() -> pd.DataFrame:
    """NAND presets (P/E, WAF, rating days) with their implied DWPD; see the CSV's header."""
    path = data_file("hardware", "nand_presets.csv")
    df = pd.read_csv(path, comment="#").fillna({"feature": ""})
    for col in ("pe_cycles", "waf", "rating_days"):
        bad = df[~(df[col] > 0)]
        if len(bad):
            raise ValueError(f"{path}: column {col!r} must be > 0 (row {bad.index[0] + 1})")
    # TBW per unit capacity / rating days; capacity cancels out of DWPD.
    df["dwpd"] = df.pe_cycles / df.waf / df.rating_days
    return df


def c_bound_curves(daily_writes_tb: Sequence[float], presets: Sequence[str] | None = None,
                   n_ssds: int = 1) -> pd.DataFrame:
    """Tidy C_bound (TB) vs daily write volume (TB/day) for each NAND preset (figure B8)."""
    table = nand_presets()
    if presets is not None:
        unknown = sorted(set(presets) - set(table.name))
        if unknown:
            raise ValueError(f"unknown NAND preset(s) {unknown} (parameter 'presets'); "
                             f"known: {list(table.name)}")
        table = table[table.name.isin(presets)]
    rows = []
    for _, preset in table.iterrows():
        for writes_tb in daily_writes_tb:
            c_tb = c_bound_bytes(writes_tb * 1e12, preset.dwpd, n_ssds) / 1e12
            rows.append({"preset": preset["name"], "nand": preset.nand, "feature": preset.feature,
                         "dwpd": preset.dwpd, "daily_writes_tb": float(writes_tb),
                         "c_bound_tb": c_tb})
    return pd.DataFrame(rows)


def dwpd_by_raid(write_rates_bytes_s: Sequence[float], n_drives: int,
                 drive_capacity_bytes: float, raid_levels: Sequence[str | int]) -> pd.DataFrame:
    """Tidy DWPD per drive vs write rate for several RAID levels (figure A7)."""
    rows = []
    for level in raid_levels:
        name = normalize_raid_level(level)
        for rate in write_rates_bytes_s:
            rows.append({"raid_level": name, "write_rate_bytes_s": float(rate),
                         "dwpd": dwpd_from_write_rate(rate, n_drives, drive_capacity_bytes, name)})
    return pd.DataFrame(rows)
