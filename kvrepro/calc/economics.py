"""Tokens per dollar by cache tier (study A's closing claim, figure A9), with prices as data.

Study A ends on an economic claim without numbers: once DRAM is full, flash serves more tokens
per second on a medium that costs less per terabyte, so tokens per dollar favour flash, the
more so the longer the context must be kept. This module puts numbers on it for any prices.

* Prices are data (`data/hardware/prices.csv`), each row with a date and a source, because
  DRAM and flash prices moved by multiples in 2025-2026. `load_prices` checks every row (a
  missing or non-positive price is an error naming the file, line and item) and takes
  overrides.
* Hardware: a `ServerBill` (what every configuration has: server, GPUs, base host DRAM, power
  draws, amortisation period) plus one `TierHardware` per tier (the DRAM, flash drives and
  shared-filesystem capacity it adds): the sum of its stores' bills (`StoreBill`, each store
  kind says what it adds). Capacities are bytes, as the spec states them; they become GB or
  TB only where a price per GB or TB is applied (`tier_capex_usd`, `tier_watts`) or a
  table shows them.
* The DRAM bill is by kind: every store that takes host DRAM counts, a flash tier's staging
  buffer included. The what-if aliases (`dram_gb`, `staging_gb`, `flash_gb` in
  `kvrepro.tier_spec.override_server`) set stores by *name*: `dram_gb` resizes the stores
  named "dram", not a staging buffer, though the bill counts both as DRAM (to resize every
  store the bill counts as DRAM, override by kind: `kind:dram.capacity_bytes`).
* Cost per hour = capex / (amortisation years x 8,760 h) + watts / 1,000 x $/kWh: the server
  runs 24/7 and is written off linearly; no financing, space or staff.
* Tokens per dollar = tok/s x 3,600 / ($/h), for the whole server and for the cache tier alone
  (its own capex and power): per tier and time bin of a run (`tokens_per_dollar`), and vs the
  TTL a tier must retain when it is sized for it (`tokens_per_dollar_vs_ttl`).

Everything here is generic (any server, any run, any prices) and reads no run itself: a
plateau or a cross-over is passed in. What one study quotes from it (A9's and B1's numbers,
study A's tiers and served rates) lives with the studies (`economics_quotes`).
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from kvrepro._checks import positive, require_columns
from kvrepro._paths import data_file
from kvrepro.calc import sizing
from kvrepro.tier_spec import (
    DriveArray,
    ServerSpec,
    TierSpec,
    normalize_raid_level,
    raid_data_drives,
)

# A RAID level as `kvrepro.tier_spec` names it ("raid10", 10, "RAID 10" -> "RAID10").
RaidLevel = Annotated[str, AfterValidator(normalize_raid_level)]

HOURS_PER_YEAR = 8760.0
DEFAULT_PRICE_SET = "early-2026"
PRICE_COLUMNS = ("price_set", "item", "usd", "unit", "date", "source")
PRICE_UNITS = {"dram": "per_gb", "flash": "per_tb", "gpu": "each", "server": "each",
               "electricity": "per_kwh", "shared_fs": "per_tb"}
PRICE_FIELDS = {"dram": "dram_usd_per_gb", "flash": "flash_usd_per_tb", "gpu": "gpu_usd_each",
                "server": "server_usd_each", "electricity": "electricity_usd_per_kwh",
                "shared_fs": "shared_fs_usd_per_tb"}
OPTIONAL_PRICES = ("shared_fs",)
"""Items a price set may leave out: `PriceSet`'s default (an estimate) is used, and
`price_table` lists the item only where the file or an override gives it."""
SHARED_FS_USD_PER_TB = 1000.0
SHARED_FS_SOURCE = ("estimate: one usable TB of an all-flash shared filesystem (an NFS or "
                    "parallel-filesystem appliance: SSDs at ~$356/TB raw as early-2026's flash "
                    "price, erasure-coding overhead, controllers and network ports), about 3x "
                    "raw flash; no quoted price used; its power is in the price")


# ---------------------------------------------------------------- prices

class PriceSet(BaseModel):
    """One consistent set of prices, each with the date and source it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    dram_usd_per_gb: float = Field(gt=0, description="host DRAM (DDR5 RDIMM), $/GB")
    flash_usd_per_tb: float = Field(gt=0, description="enterprise NVMe flash, $/TB raw")
    gpu_usd_each: float = Field(gt=0, description="one GPU, $")
    server_usd_each: float = Field(gt=0, description="server without GPUs, memory, data drives")
    electricity_usd_per_kwh: float = Field(gt=0, description="all-in, cooling included, $/kWh")
    shared_fs_usd_per_tb: float = Field(SHARED_FS_USD_PER_TB, gt=0, description=(
        "usable capacity of a shared filesystem (shared_fs stores), $/TB, power included; "
        "default: an " + SHARED_FS_SOURCE))
    dates: dict[str, str] = Field(description="item -> ISO date of its price ('override')")
    sources: dict[str, str] = Field(description="item -> where its price comes from")


def _price_rows(path: Path) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) of every data line; lines starting with # are comments."""
    numbered = [(i, line) for i, line in enumerate(path.read_text().splitlines(), 1)
                if line.strip() and not line.lstrip().startswith("#")]
    if not numbered:
        raise ValueError(f"{path}: no header line (columns {list(PRICE_COLUMNS)})")
    reader = csv.reader(line for _, line in numbered)
    header = [h.strip() for h in next(reader)]
    missing = [c for c in PRICE_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"{path}, line {numbered[0][0]}: header lacks column(s) {missing}")
    rows = []
    for (line_no, _), values in zip(numbered[1:], reader, strict=True):
        if len(values) != len(header):
            raise ValueError(f"{path}, line {line_no}: {len(values)} fields, the header has "
                             f"{len(header)}")
        rows.append((line_no, dict(zip(header, (v.strip() for v in values), strict=True))))
    return rows


def _check_price_row(path: Path, line_no: int, row: dict[str, str]) -> float:
    """The row's price in USD, after checking item, price, unit, date and source."""
    item = row["item"]
    where = f"{path}, line {line_no} (price set {row['price_set']!r}, item {item!r})"
    if item not in PRICE_UNITS:
        raise ValueError(f"{where}: unknown item; known: {list(PRICE_UNITS)}")
    if row["usd"] == "":
        raise ValueError(f"{where}: column 'usd' has no price")
    try:
        usd = float(row["usd"])
    except ValueError:
        raise ValueError(f"{where}: column 'usd' is not a number: {row['usd']!r}") from None
    if not math.isfinite(usd) or usd <= 0:
        raise ValueError(f"{where}: column 'usd' must be a price > 0, got {row['usd']}")
    if row["unit"] != PRICE_UNITS[item]:
        raise ValueError(f"{where}: column 'unit' must be {PRICE_UNITS[item]!r}, "
                         f"got {row['unit']!r}")
    try:
        dt.date.fromisoformat(row["date"])
    except ValueError:
        raise ValueError(f"{where}: column 'date' must be an ISO date (YYYY-MM-DD), "
                         f"got {row['date']!r}") from None
    if not row["source"]:
        raise ValueError(f"{where}: column 'source' is empty; say where the price comes from")
    return usd


def _read_price_sets(path: Path) -> dict[str, dict[str, tuple[float, str, str]]]:
    """price set -> item -> (usd, date, source), every row checked."""
    sets: dict[str, dict[str, tuple[float, str, str]]] = {}
    for line_no, row in _price_rows(path):
        usd = _check_price_row(path, line_no, row)
        items = sets.setdefault(row["price_set"], {})
        if row["item"] in items:
            raise ValueError(f"{path}, line {line_no}: item {row['item']!r} appears twice in "
                             f"price set {row['price_set']!r}")
        items[row["item"]] = (usd, row["date"], row["source"])
    return sets


def load_prices(price_set: str = DEFAULT_PRICE_SET, path: str | Path | None = None,
                overrides: Mapping[str, float | None] | None = None) -> PriceSet:
    """Load one price set from `data/hardware/prices.csv` (or your own file at `path`).

    Every row of the file is checked, not only the chosen set's, so a broken row is found
    the first time the file is read. `overrides` maps `PriceSet` price fields (e.g.
    `dram_usd_per_gb`) to your prices; None leaves the file's price. An overridden price shows
    'override' as its date and the parameter as its source.
    """
    path = Path(path) if path else data_file("hardware", "prices.csv")
    if not path.is_file():
        raise FileNotFoundError(f"prices file not found: {path} (parameter 'prices_file')")
    sets = _read_price_sets(path)
    if price_set not in sets:
        raise ValueError(f"{path}: no price set {price_set!r} (parameter 'price_set'); "
                         f"known: {sorted(sets)}")
    found = sets[price_set]
    missing = [item for item in PRICE_UNITS if item not in found and item not in OPTIONAL_PRICES]
    if missing:
        raise ValueError(f"{path}: price set {price_set!r} lacks item(s) {missing}")
    fields = {PRICE_FIELDS[item]: usd for item, (usd, _, _) in found.items()}
    dates = {item: date for item, (_, date, _) in found.items()}
    sources = {item: source for item, (_, _, source) in found.items()}
    by_field = {f: item for item, f in PRICE_FIELDS.items()}
    for key, value in (overrides or {}).items():
        if key not in by_field:
            raise ValueError(f"unknown price override {key!r}; known: {sorted(by_field)}")
        if value is None:
            continue
        positive(**{key: value})
        fields[key] = float(value)
        dates[by_field[key]], sources[by_field[key]] = "override", f"parameter {key}"
    return PriceSet(name=price_set, dates=dates, sources=sources, **fields)


def price_table(prices: PriceSet) -> pd.DataFrame:
    """The prices in use with their unit, date and source: what a reader must see first (an
    optional item the price set does not give is left out: its default prices nothing the
    shipped servers have)."""
    return pd.DataFrame([{"item": item, "usd": getattr(prices, PRICE_FIELDS[item]),
                          "unit": unit, "date": prices.dates[item],
                          "source": prices.sources[item]} for item, unit in PRICE_UNITS.items()
                         if item in prices.dates])


# ---------------------------------------------------------------- hardware

class ServerBill(BaseModel):
    """What every configuration of the server has, and how its cost is spread over time.

    Defaults are study A's server (4x RTX PRO 6000 Blackwell Server Edition, Dell XE7740
    class). Power draws are datasheet maxima or estimates; next to the amortised hardware they
    are a small share of the cost.
    """

    model_config = ConfigDict(extra="forbid")

    gpus: int = Field(4, gt=0, description="GPUs in the server")
    base_dram_gb: float = Field(256.0, ge=0, description="host DRAM every configuration needs "
                                "(OS, vLLM, loading weights), GB; estimate")
    max_dram_gb: float = Field(4096.0, gt=0, description="most host DRAM the server takes "
                               "(32 slots x 128 GB), GB")
    amortisation_years: float = Field(3.0, gt=0, description="hardware written off linearly "
                                      "over this many years of 24/7 use")
    gpu_watts: float = Field(600.0, ge=0, description="per GPU (RTX PRO 6000 Server Ed. max)")
    server_watts: float = Field(1500.0, ge=0, description="CPUs, fans, NICs; estimate")
    dram_watts_per_gb: float = Field(0.1, ge=0, description="~6 W per 64 GB RDIMM; estimate")
    drive_watts: float = Field(25.0, ge=0, description="per NVMe drive, active (Gen5 E3.S)")


class TierHardware(DriveArray):
    """What one cache tier adds to the server: host DRAM for it, flash drives, and its share
    of a shared filesystem (bytes, as the spec states capacities)."""

    name: str = Field(min_length=1)
    dram_bytes: float = Field(0.0, ge=0, description="host DRAM bought for the tier (every "
                              "store that takes DRAM: the DRAM tier's, a flash tier's staging "
                              "buffer), bytes")
    shared_fs_bytes: float = Field(0.0, ge=0, description="the server's share of a shared "
                                   "filesystem's capacity, bytes")

    @property
    def dram_gb(self) -> float:
        """`dram_bytes` in GB (decimal), the unit DRAM is priced in."""
        return self.dram_bytes / 1e9

    @property
    def shared_fs_tb(self) -> float:
        """`shared_fs_bytes` in TB (decimal), the unit shared capacity is priced in."""
        return self.shared_fs_bytes / 1e12

    @property
    def usable_tb(self) -> float:
        """Flash capacity after the RAID layout, TB (0 without drives)."""
        return usable_tb(self.drives, self.drive_tb, self.raid_level) if self.drives else 0.0


def tier_hardware(tier: TierSpec) -> TierHardware:
    """What a tier of a server spec adds: the sum of its stores' bills (`StoreBill`): the
    DRAM of every store that takes some, the drive array of the store that has one, the
    shared-filesystem share of a shared store. A tier with two drive arrays is refused (one
    array per tier is what the cost model prices)."""
    bills = [s.bill() for s in tier.stores]
    arrays = [b for b in bills if b.drives]
    if len(arrays) > 1:
        raise ValueError(f"tier {tier.name!r}: {len(arrays)} stores bring drives; the cost "
                         "model prices one drive array per tier")
    array = ({"drives": arrays[0].drives, "drive_tb": arrays[0].drive_tb,
              "raid_level": arrays[0].raid_level} if arrays else {})
    return TierHardware(name=tier.name, dram_bytes=sum(b.dram_bytes for b in bills),
                        shared_fs_bytes=sum(b.shared_fs_bytes for b in bills), **array)


def server_hardware(spec: ServerSpec, tiers: Sequence[str] | None = None
                    ) -> dict[str, TierHardware]:
    """The hardware bill of each named tier of a server spec (all tiers by default)."""
    return {name: tier_hardware(spec.tier(name)) for name in (tiers or list(spec.tiers))}


def usable_tb(drives: int, drive_tb: float, raid_level: str) -> float:
    """Usable capacity of `drives` drives in a RAID layout (mirrors and parity excluded)."""
    return raid_data_drives(raid_level, drives) * drive_tb


def drives_for(kv_tb: float, drive_tb: float, raid_level: str) -> int:
    """Fewest drives whose usable capacity holds `kv_tb` (at least the layout's minimum)."""
    level = normalize_raid_level(raid_level)
    data = max(1, math.ceil(kv_tb / drive_tb - 1e-9))
    if level == "RAID1" and data > 1:
        raise ValueError(f"RAID1 holds one drive ({drive_tb:g} TB), not {kv_tb:.3g} TB")
    for n in range(data, 2 * data + 5):
        try:
            if usable_tb(n, drive_tb, level) >= data * drive_tb:
                return n
        except ValueError:
            continue
    raise AssertionError(f"no drive count found for {kv_tb} TB in {level}")  # unreachable


# ---------------------------------------------------------------- costs

def tier_capex_usd(tier: TierHardware, prices: PriceSet) -> float:
    """Hardware price of what the tier adds: its DRAM, its drives (raw TB) and its share of
    a shared filesystem (usable TB)."""
    capex = (tier.dram_gb * prices.dram_usd_per_gb
             + tier.drives * tier.drive_tb * prices.flash_usd_per_tb)
    if tier.shared_fs_bytes:
        capex += tier.shared_fs_tb * prices.shared_fs_usd_per_tb
    return capex


def tier_watts(tier: TierHardware, bill: ServerBill) -> float:
    """Power the tier's DRAM and drives draw, W (a shared filesystem's is in its price)."""
    return tier.dram_gb * bill.dram_watts_per_gb + tier.drives * bill.drive_watts


def server_capex_usd(bill: ServerBill, prices: PriceSet) -> float:
    """Hardware price of what every configuration has: server, GPUs, base host DRAM."""
    return (prices.server_usd_each + bill.gpus * prices.gpu_usd_each
            + bill.base_dram_gb * prices.dram_usd_per_gb)


def server_watts(bill: ServerBill) -> float:
    """Power of what every configuration has, W."""
    return (bill.server_watts + bill.gpus * bill.gpu_watts
            + bill.base_dram_gb * bill.dram_watts_per_gb)


def usd_per_hour(capex_usd: float, watts: float, bill: ServerBill, prices: PriceSet) -> float:
    """Amortised hardware plus electricity, $ per hour of 24/7 operation."""
    return (capex_usd / (bill.amortisation_years * HOURS_PER_YEAR)
            + watts / 1000 * prices.electricity_usd_per_kwh)


def cost_table(tiers: Mapping[str, TierHardware], bill: ServerBill,
               prices: PriceSet) -> pd.DataFrame:
    """Per tier: capex and $/h of the cache tier alone and of the whole server with it, and
    what it adds (`tier_dram_gb`, `tier_flash_usable_tb`; `tier_shared_fs_tb` where a tier
    has a shared filesystem)."""
    base_usd, base_w = server_capex_usd(bill, prices), server_watts(bill)
    rows = []
    for name, tier in tiers.items():
        capex, watts = tier_capex_usd(tier, prices), tier_watts(tier, bill)
        rows.append({"tier": name, "tier_capex_usd": capex,
                     "server_capex_usd": base_usd + capex,
                     "tier_usd_per_h": usd_per_hour(capex, watts, bill, prices),
                     "server_usd_per_h": usd_per_hour(base_usd + capex, base_w + watts, bill,
                                                      prices),
                     "tier_dram_gb": tier.dram_gb, "tier_flash_usable_tb": tier.usable_tb,
                     "tier_shared_fs_tb": tier.shared_fs_tb})
    table = pd.DataFrame(rows)
    if not any(tier.shared_fs_bytes for tier in tiers.values()):
        table = table.drop(columns="tier_shared_fs_tb")
    return table


# ---------------------------------------------------------------- tokens per dollar over a run

def tokens_per_dollar(binned: pd.DataFrame, costs: pd.DataFrame,
                      column: str = "total_tok_s") -> pd.DataFrame:
    """Tokens per dollar per tier and time bin of a run: tok/s x 3,600 / ($/h).

    `binned` is `analysis.throughput_over_time` output (simulated or live), `costs` is
    `cost_table` output. Adds `tok_per_usd_server` (whole server) and `tok_per_usd_tier`
    (cache tier alone; NaN for a tier that adds no hardware, the VRAM baseline). The result
    keeps `tier, bin_start_s, bin_end_s`, so `analysis.crossover_time_s` reads it.
    """
    require_columns(binned, ["tier", "bin_start_s", "bin_end_s", column], "tokens_per_dollar")
    unknown = sorted(set(binned["tier"]) - set(costs["tier"]))
    if unknown:
        raise ValueError(f"tokens_per_dollar: no hardware for tier(s) {unknown}; "
                         f"costs cover {list(costs['tier'])}")
    out = binned.merge(costs[["tier", "tier_usd_per_h", "server_usd_per_h"]], on="tier",
                       how="left", validate="many_to_one")
    tier_usd_per_h = out["tier_usd_per_h"].where(out["tier_usd_per_h"] > 0)
    out["tok_per_usd_server"] = out[column] * 3600 / out["server_usd_per_h"]
    out["tok_per_usd_tier"] = out[column] * 3600 / tier_usd_per_h
    return out


# ---------------------------------------------------------------- tokens per dollar vs TTL

class Retention(BaseModel):
    """How a tier is sized to keep a TTL of KV, as in A6: tok/s x TTL x KV bytes per token."""

    model_config = ConfigDict(extra="forbid")

    kv_rate_tok_s: float = Field(4200.0, gt=0, description="tokens per second whose KV must "
                                 "be kept (A6: the DRAM tier's moderate operating point)")
    kv_bytes_per_token: float = Field(gt=0, description="KV bytes per token of the model")
    kv_cache_bytes: float = Field(gt=0, description="KV the GPUs hold: all the baseline keeps "
                                  "(the server's engine.kv_cache_bytes)")
    staging_gb: float = Field(ge=0, description="DRAM staging in front of the flash, GB (a "
                              "flash tier's dram store: `tier_hardware(tier).dram_gb`)")
    drive_tb: float = Field(12.8, gt=0, description="capacity per flash drive, TB")
    raid_level: RaidLevel = Field("RAID10", description="layout of the flash array")


def _sized_baseline(kv_bytes: float, retention: Retention,
                    bill: ServerBill) -> TierHardware | None:
    """Only what VRAM holds."""
    return TierHardware(name="baseline") if kv_bytes <= retention.kv_cache_bytes else None


def _sized_dram(kv_bytes: float, retention: Retention, bill: ServerBill) -> TierHardware | None:
    """Exactly the bytes in DRAM, up to the server's DRAM slots."""
    fits = bill.base_dram_gb + kv_bytes / 1e9 <= bill.max_dram_gb
    return TierHardware(name="dram", dram_bytes=kv_bytes) if fits else None


def _sized_flash(kv_bytes: float, retention: Retention, bill: ServerBill) -> TierHardware:
    """The staging buffer plus whole drives in the RAID layout."""
    return _flash_tier(drives_for(kv_bytes / 1e12, retention.drive_tb, retention.raid_level),
                       retention)


def _flash_tier(drives: int, retention: Retention) -> TierHardware:
    return TierHardware(name="flash", dram_bytes=retention.staging_gb * 1e9, drives=drives,
                        drive_tb=retention.drive_tb, raid_level=retention.raid_level)


SIZED_TIERS: dict[str, Callable[[float, Retention, ServerBill], TierHardware | None]] = {
    "baseline": _sized_baseline, "dram": _sized_dram, "flash": _sized_flash}
"""The registry of tier kinds the TTL sizing knows: kind -> its sizing function."""
TIER_KINDS = tuple(SIZED_TIERS)


def sized_tier(kind: str, kv_bytes: float, retention: Retention,
               bill: ServerBill) -> TierHardware | None:
    """The smallest tier of `kind` that holds `kv_bytes`, or None if none fits the server
    (`SIZED_TIERS`: baseline, only what VRAM holds; dram, exactly the bytes, up to the
    server's DRAM slots; flash, the staging buffer plus whole drives in the RAID layout)."""
    if kind not in SIZED_TIERS:
        raise ValueError(f"unknown tier kind {kind!r}; known: {list(TIER_KINDS)}")
    return SIZED_TIERS[kind](kv_bytes, retention, bill)


def _ttl_row(kind: str, ttl_s: float, kv_bytes: float, tok_s: float, tier: TierHardware | None,
             bill: ServerBill, prices: PriceSet) -> dict[str, float | str | bool]:
    row: dict[str, float | str | bool] = {"tier": kind, "ttl_s": float(ttl_s),
                                          "kv_bytes": kv_bytes, "tok_s": tok_s,
                                          "fits": tier is not None}
    if tier is None:
        return {**row, "drives": math.nan, "tier_capex_usd": math.nan, "tier_usd_per_h": math.nan,
                "server_usd_per_h": math.nan, "tok_per_usd_server": math.nan,
                "tok_per_usd_tier": math.nan}
    [cost] = cost_table({kind: tier}, bill, prices).to_dict("records")
    tier_h = cost["tier_usd_per_h"]
    return {**row, "drives": tier.drives, "tier_capex_usd": cost["tier_capex_usd"],
            "tier_usd_per_h": tier_h, "server_usd_per_h": cost["server_usd_per_h"],
            "tok_per_usd_server": tok_s * 3600 / cost["server_usd_per_h"],
            "tok_per_usd_tier": tok_s * 3600 / tier_h if tier_h > 0 else math.nan}


def tokens_per_dollar_vs_ttl(ttls_s: Sequence[float], served_tok_s: Mapping[str, float],
                             retention: Retention, bill: ServerBill,
                             prices: PriceSet) -> pd.DataFrame:
    """Tokens per dollar of each tier when it is sized to retain each TTL (A9 vs TTL).

    A tier is sized by `sized_tier` and serves `served_tok_s[tier]` (e.g. study A's
    `served_rates` of a run, or equal rates to compare cost alone). Rows where the tier
    cannot hold the TTL in one server have `fits` False and NaN costs. Columns: `tier, ttl_s,
    kv_bytes, tok_s, fits, drives, tier_capex_usd, tier_usd_per_h, server_usd_per_h,
    tok_per_usd_server, tok_per_usd_tier`.
    """
    if len(ttls_s) == 0:
        raise ValueError("parameter 'ttls_s' is empty")
    unknown = sorted(set(served_tok_s) - set(TIER_KINDS))
    if unknown:
        raise ValueError(f"served_tok_s: unknown tier(s) {unknown}; known: {list(TIER_KINDS)}")
    rows = []
    for ttl_s in ttls_s:
        kv_bytes = sizing.kv_capacity(retention.kv_rate_tok_s, ttl_s,
                                      retention.kv_bytes_per_token)["kv_bytes"]
        for kind, tok_s in served_tok_s.items():
            positive(served_tok_s=tok_s)
            tier = sized_tier(kind, kv_bytes, retention, bill)
            rows.append(_ttl_row(kind, ttl_s, kv_bytes, float(tok_s), tier, bill, prices))
    return pd.DataFrame(rows)


def crossover_ttl_s(vs_ttl: pd.DataFrame, a: str = "flash", b: str = "dram",
                    column: str = "tok_per_usd_server") -> float:
    """Shortest TTL from which tier a's tokens per dollar stay at or above tier b's.

    A TTL that b cannot hold in one server while a can counts as a ahead. Exact to the step of
    the TTL grid; NaN if a is still behind at the longest TTL.
    """
    require_columns(vs_ttl, ["tier", "ttl_s", column], "crossover_ttl_s")
    wide = vs_ttl.pivot(index="ttl_s", columns="tier", values=column).sort_index()
    missing = [t for t in (a, b) if t not in wide.columns]
    if missing:
        raise ValueError(f"crossover_ttl_s: tier(s) {missing} not in the data "
                         f"(tiers: {list(wide.columns)})")
    ahead = ((wide[a] >= wide[b]) | (wide[b].isna() & wide[a].notna())).to_numpy()
    behind = np.flatnonzero(~ahead)
    if len(behind) == 0:
        return float(wide.index[0])
    return float(wide.index[behind[-1] + 1]) if behind[-1] + 1 < len(wide) else math.nan


def break_even_kv_bytes(retention: Retention, bill: ServerBill, prices: PriceSet) -> float:
    """Retained KV from which a flash tier costs no more per hour than a DRAM tier holding it.

    At equal throughput this is where flash overtakes DRAM per dollar, and it depends on
    prices and hardware only. DRAM costs grow with every byte; flash costs a staging buffer
    plus the layout's smallest array, then steps by drives. Past the server's DRAM slots DRAM
    cannot hold the KV at all, so the answer is at most that capacity. NaN if flash cannot
    grow far enough (RAID1 holds one drive).
    """
    dram_gb_max = bill.max_dram_gb - bill.base_dram_gb
    per_gb_h = usd_per_hour(prices.dram_usd_per_gb, bill.dram_watts_per_gb, bill, prices)
    lower_gb, kv_tb = 0.0, 0.0
    while lower_gb < dram_gb_max:
        try:
            drives = drives_for(kv_tb, retention.drive_tb, retention.raid_level)
        except ValueError:
            return math.nan
        flash = _flash_tier(drives, retention)
        flash_h = usd_per_hour(tier_capex_usd(flash, prices), tier_watts(flash, bill), bill,
                               prices)
        upper_gb = flash.usable_tb * 1000
        if flash_h / per_gb_h <= upper_gb:
            return min(max(lower_gb, flash_h / per_gb_h), dram_gb_max) * 1e9
        lower_gb, kv_tb = upper_gb, flash.usable_tb + retention.drive_tb / 2
    return dram_gb_max * 1e9


def break_even_ttl_s(retention: Retention, bill: ServerBill, prices: PriceSet) -> float:
    """The TTL whose retained KV is `break_even_kv_bytes`: KV bytes / (tok/s x bytes per
    token), the same A6 arithmetic `tokens_per_dollar_vs_ttl` sizes tiers with."""
    return break_even_kv_bytes(retention, bill, prices) / (
        retention.kv_rate_tok_s * retention.kv_bytes_per_token)
