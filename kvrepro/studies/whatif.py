"""Study A's what-if sweeps: the point functions `kvrepro.sweep.run_sweep` runs, and their grids.

`kvrepro.sweep` is the generic runner (points, grids, Ray, resumable folders, the Pareto
view); what a point *means* is here, with the studies, because it names study A's server
bill, its fitted pause between turns and the curve settings of its headlines:

* `default_point` runs the single-server twin (`kvrepro.engines.sim.campaign.run`) on an
  agentic workload, or the fleet twin (`kvrepro.engines.sim.fleet.simulate_fleet`) when the
  point has `n_servers` or `routing`, reads either with `fleet_headlines` (the same columns),
  and prices the configuration with `kvrepro.calc.economics` (as notebook 10 does) so that
  the throughput per dollar can be set against the p90 TTFT (`kvrepro.sweep.pareto_front`).
  It is the point function of the shipped grids (`data/sweeps/*.yaml`, `DEFAULT_POINT_FUNCTION`);
* `whatif_point` runs the same single-server point and also reads where its tier saturates
  (peak and late throughput on study A's curve settings, the fill time of the tier's store):
  notebook 07's sweep, whose points `whatif_grid` builds and `whatif_table` labels.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError as _ValidationError

from kvrepro import analysis
from kvrepro._checks import key_path
from kvrepro.studies.study_a_headlines import StudyASettings, study_a_rates
from kvrepro.sweep import Point, expand_grid, point_function, point_id

DEFAULT_POINT_FUNCTION = "kvrepro.studies.whatif:default_point"
"""What a grid file names as its point function to run `default_point`."""

WORKLOAD_KEYS = ("seed", "session_rate_per_min", "duration_s", "warmup_s")
"""Point parameters of the agentic workload (`AgenticSpec`); others as `workload.<field>`."""
FLEET_KEYS = ("n_servers", "routing", "kv_pool")
"""Point parameters that make a point a fleet (`FleetSpec`); also `shared_pool.<field>` and
`prefix_aware.<field>`."""
PREFIXES = ("server.", "workload.", "shared_pool.", "prefix_aware.", "bill.", "price.")
NAMED_PAUSES = {"study_a": "kvrepro.studies.study_a:STUDY_A_PAUSE"}
"""`workload.pause: study_a` stands for study A's fitted pause between turns."""
DEFAULT_POINT_VERSION = "1"


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"pause.kind": "x", "seed": 1} -> {"pause": {"kind": "x"}, "seed": 1}."""
    tree: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = tree
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


def _resolve_pause(value: Any) -> Any:
    if isinstance(value, str):
        if value not in NAMED_PAUSES:
            raise ValueError(f"parameter 'workload.pause': unknown name {value!r}; known: "
                             f"{sorted(NAMED_PAUSES)} (or set workload.pause.kind, ...)")
        module, _, attr = NAMED_PAUSES[value].partition(":")
        return dict(getattr(importlib.import_module(module), attr))
    return value


def split_point(point: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The default point's parameters by what they set: `fleet` (server, tier and the
    `FleetSpec` keys), `server` (overrides of the server spec: `dram_gb`, `flash_gb`,
    `staging_gb`, `server.<dotted path>`), `workload` (`AgenticSpec`), `run`
    (`max_in_flight`), `bill` (`ServerBill`) and `price` (`price_set`, `price.<field>`).
    An unknown parameter is an error naming it."""
    from kvrepro.tier_spec import CAPACITY_ALIASES

    parts: dict[str, dict[str, Any]] = {k: {} for k in ("fleet", "server", "workload", "run",
                                                        "bill", "price")}
    for key, value in point.items():
        prefix, _, rest = key.partition(".")
        if key in ("server", "tier", *FLEET_KEYS):
            parts["fleet"][key] = value
        elif key in CAPACITY_ALIASES:
            parts["server"][key] = value
        elif key in WORKLOAD_KEYS:
            parts["workload"][key] = value
        elif key == "max_in_flight":
            parts["run"][key] = value
        elif key == "price_set":
            parts["price"][key] = value
        elif rest and f"{prefix}." in PREFIXES:
            target = {"server": "server", "workload": "workload", "shared_pool": "fleet",
                      "prefix_aware": "fleet", "bill": "bill", "price": "price"}[prefix]
            parts[target][rest if target != "fleet" else key] = value
        else:
            raise ValueError(f"unknown parameter {key!r}; known: server, tier, "
                             f"{', '.join(sorted(CAPACITY_ALIASES))}, "
                             f"{', '.join(WORKLOAD_KEYS + FLEET_KEYS)}, max_in_flight, "
                             f"price_set, or a prefix {', '.join(p + '<key>' for p in PREFIXES)}")
    return parts


@dataclass(frozen=True)
class PointSetup:
    """Everything a default point runs with, built and validated from its parameters."""

    fleet: Any  # kvrepro.fleet_spec.FleetSpec (n_servers 1: one server)
    is_fleet: bool  # run the fleet twin: the point has n_servers or routing
    server_overrides: dict[str, Any]  # kvrepro.tier_spec.override_server keys
    spec: Any  # the server spec (kvrepro.tier_spec.ServerSpec) with the overrides applied
    workload: Any  # kvrepro.workload.AgenticSpec
    max_in_flight: int | None
    bill: Any  # kvrepro.calc.economics.ServerBill
    prices: Any  # kvrepro.calc.economics.PriceSet


def _validated(model: Any, data: Mapping[str, Any], prefix: str = "",
               plain: Sequence[str] = ()) -> Any:
    """`model.model_validate(data)`, its errors named by point parameter (`prefix` + key,
    except the `plain` top-level keys, which are point parameters as they are)."""
    try:
        return model.model_validate(data)
    except _ValidationError as err:
        problems = []
        for e in err.errors():
            key = key_path(e["loc"])
            name = key if key.split(".")[0] in plain else prefix + key
            problems.append(f"parameter {name!r}: {e['msg']}")
        raise ValueError("; ".join(problems)) from None


def point_setup(point: Mapping[str, Any]) -> PointSetup:
    """Build the fleet, server spec, workload spec and prices of a default point; every
    invalid value is an error naming its parameter."""
    from kvrepro.calc import economics
    from kvrepro.fleet_spec import FleetSpec
    from kvrepro.tier_spec import override_server
    from kvrepro.workload import AgenticSpec

    parts = split_point(point)
    missing = [k for k in ("server", "tier") if k not in parts["fleet"]]
    if missing:
        raise ValueError(f"parameter(s) {missing} missing: a point names its server spec "
                         "(cpu_tiny, study_a, or a path) and tier")
    is_fleet = any(k in parts["fleet"] for k in ("n_servers", "routing"))
    fleet = _validated(FleetSpec, _nest({"n_servers": 1, **parts["fleet"]}))
    try:
        base = fleet.server_spec()
    except FileNotFoundError as err:
        raise ValueError(f"parameter 'server': {err}") from err
    spec = override_server(base, parts["server"])
    spec.tier(fleet.tier)
    workload = _nest(parts["workload"])
    if "pause" in workload:
        workload["pause"] = _resolve_pause(workload["pause"])
    agentic = _validated(AgenticSpec, workload, "workload.", WORKLOAD_KEYS)
    if agentic.warmup_s >= agentic.duration_s:
        raise ValueError(f"parameter 'warmup_s' ({agentic.warmup_s:g} s) must be below "
                         f"'duration_s' ({agentic.duration_s:g} s): nothing would be measured")
    price_overrides = {k: v for k, v in parts["price"].items() if k != "price_set"}
    prices = economics.load_prices(parts["price"].get("price_set", economics.DEFAULT_PRICE_SET),
                                   overrides=price_overrides)
    return PointSetup(fleet=fleet, is_fleet=is_fleet, server_overrides=parts["server"],
                      spec=spec, workload=agentic,
                      max_in_flight=parts["run"].get("max_in_flight"),
                      bill=_validated(economics.ServerBill, _nest(parts["bill"]), "bill."),
                      prices=prices)


def check_default_point(point: Mapping[str, Any], where: str = "point") -> None:
    """Fail before a sweep starts on a point the default point function cannot run."""
    try:
        point_setup(point)
    except (ValueError, FileNotFoundError) as err:
        raise ValueError(f"{where}: {err}") from err


def configuration_cost(setup: PointSetup, throughput_tok_s: float) -> dict[str, float]:
    """$/h and tokens per dollar of the point's servers, priced as notebook 10 prices them
    (`economics.cost_table` of the tier's hardware, `economics.tokens_per_dollar`).

    A fleet is n servers; with a shared pool the tier's hardware is bought once, scaled by
    the pool's `capacity_scale`, instead of once per server (cost per hour is linear in
    capex and watts, so the server and tier parts add)."""
    from kvrepro.calc import economics

    tier = setup.fleet.tier
    hardware = {tier: economics.tier_hardware(setup.spec.tier(tier))}
    one = economics.cost_table(hardware, setup.bill, setup.prices).iloc[0]
    n = setup.fleet.n_servers
    tier_copies = n
    if n > 1 and setup.fleet.kv_pool == "shared":
        tier_copies = setup.fleet.shared_pool.capacity_scale
    tier_usd_h = tier_copies * float(one.tier_usd_per_h)
    usd_h = n * (float(one.server_usd_per_h) - float(one.tier_usd_per_h)) + tier_usd_h
    capex = n * (float(one.server_capex_usd) - float(one.tier_capex_usd)) + tier_copies * float(
        one.tier_capex_usd)
    binned = pd.DataFrame({"tier": [tier], "bin_start_s": [0.0], "bin_end_s": [1.0],
                           "total_tok_s": [throughput_tok_s]})
    costs = pd.DataFrame({"tier": [tier], "tier_usd_per_h": [tier_usd_h],
                          "server_usd_per_h": [usd_h]})
    per_dollar = economics.tokens_per_dollar(binned, costs).iloc[0]
    return {"usd_per_h": usd_h, "tier_usd_per_h": tier_usd_h, "capex_usd": capex,
            "tok_per_usd": float(per_dollar.tok_per_usd_server)}


def _fleet_twin() -> Any:
    """The fleet twin's module, imported when a point runs (only the twin needs it)."""
    try:
        from kvrepro.engines.sim import fleet
    except ImportError as err:
        raise RuntimeError(f"the default point needs the fleet twin, "
                           f"kvrepro.engines.sim.fleet: {err}") from err
    return fleet


def _run_single(setup: PointSetup, workload: Any) -> Any:
    """One server's run (`kvrepro.engines.run_result.RunResult`): the single-server twin's
    `run`, the interface the live engine shares."""
    from kvrepro.engines.sim import sim_profile
    from kvrepro.engines.sim.campaign import run

    return run(workload, sim_profile(setup.spec), setup.fleet.tier, progress=False,
               warmup_s=setup.workload.warmup_s, max_in_flight=setup.max_in_flight)


def _single_server(setup: PointSetup, workload: Any) -> dict[str, float]:
    """One server: `_run_single`, read by `_single_headlines`."""
    return _single_headlines(setup, _run_single(setup, workload))


def _single_headlines(setup: PointSetup, result: Any) -> dict[str, float]:
    """One server's run read by `fleet_headlines` as a fleet of one with private stores, so
    that one server's and a fleet's rows have the same columns by the same definitions."""
    fleet_twin = _fleet_twin()
    tier = setup.fleet.tier
    one = setup.fleet.model_copy(update={"n_servers": 1, "kv_pool": "private"})
    as_fleet = fleet_twin.FleetResult(
        result.records.assign(instance=0, routed_away=False),
        result.samples.assign(instance=0), result.meta["stats"], one,
        [s.name for s in setup.spec.tier(tier).stores], setup.workload.warmup_s,
        setup.workload.duration_s)
    return {**fleet_twin.fleet_headlines(as_fleet),
            "unfinished_requests": float(result.meta["stats"].get("unfinished", 0))}


def _fleet(setup: PointSetup, workload: Any) -> dict[str, float]:
    """N servers behind a router: the fleet twin (`simulate_fleet`, `fleet_headlines`)."""
    fleet_twin = _fleet_twin()
    result = fleet_twin.simulate_fleet(workload, setup.fleet, progress=False,
                                       warmup_s=setup.workload.warmup_s,
                                       max_in_flight=setup.max_in_flight,
                                       profile_overrides=setup.server_overrides or None)
    return {**fleet_twin.fleet_headlines(result),
            "unfinished_requests": float(result.stats.get("unfinished", 0))}


@point_function(DEFAULT_POINT_VERSION)
def default_point(point: Mapping[str, Any]) -> dict[str, float]:
    """A twin run of one configuration and its headline numbers, priced.

    Parameters (`split_point`): `server` and `tier` (required); `dram_gb`, `flash_gb`,
    `staging_gb`, `server.<path>` (what-if overrides of the server spec); `seed`,
    `session_rate_per_min` (the whole fleet's), `duration_s`, `warmup_s`, `workload.<field>`
    (the agentic workload; `workload.pause: study_a` for study A's pause); `max_in_flight`;
    `n_servers`, `routing`, `kv_pool`, `shared_pool.<field>`, `prefix_aware.<field>` (a
    fleet: the fleet twin); `price_set`, `price.<field>` and `bill.<field>`
    (`economics.ServerBill`, default study A's server). Returns
    `kvrepro.engines.sim.fleet.fleet_headlines` (throughput in total and per server, median
    and p90 TTFT, cached shares by source, cross-instance hits, store writes per day and
    peak use; one server is read as a fleet of one), `unfinished_requests` and
    `configuration_cost` ($/h, tokens per dollar).
    """
    from kvrepro.workload import generate_agentic

    setup = point_setup(point)
    workload = generate_agentic(setup.workload)
    headlines = (_fleet if setup.is_fleet else _single_server)(setup, workload)
    return {**headlines, **configuration_cost(setup, headlines["throughput_tok_s"])}


default_point.check = check_default_point  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the what-if point function

WHATIF_POINT_VERSION = "1"
READ_KEYS = ("read.bin_s", "read.smooth_bins", "read.smooth", "read.fill_store")
"""`whatif_point`'s parameters of how the run is read (the rest are `default_point`'s):
the bin width and smoothing of the throughput curve (`StudyASettings` fields
`bin_s`, `smooth_bins`, `smooth`) and the store whose fill time is reported."""


@dataclass(frozen=True)
class WhatIfRead:
    """How `whatif_point` reads its run: study A's curve settings and the store that fills."""

    settings: StudyASettings  # run_s = the point's duration_s
    fill_store: str


def _whatif_read(point: Mapping[str, Any], setup: PointSetup) -> WhatIfRead:
    """The `read.*` parameters as `StudyASettings` (checked by the analysis' own rules) and
    the fill store (default: the tier's last store, its slowest and largest)."""
    if setup.is_fleet:
        raise ValueError("whatif_point reads one server's run; parameters n_servers / routing "
                         "make a fleet (use default_point)")
    stores = [s.name for s in setup.spec.tier(setup.fleet.tier).stores]
    fill_store = point.get("read.fill_store", stores[-1] if stores else "")
    if fill_store not in [*stores, ""]:
        raise ValueError(f"parameter 'read.fill_store': tier {setup.fleet.tier!r} has no store "
                         f"{fill_store!r}; its stores: {stores}")
    defaults = StudyASettings()
    bin_s = point.get("read.bin_s", defaults.bin_s)
    if isinstance(bin_s, bool) or not isinstance(bin_s, int | float) or not (
            math.isfinite(bin_s) and bin_s > 0):
        raise ValueError(f"parameter 'read.bin_s' must be a number of seconds > 0, got {bin_s!r}")
    settings = StudyASettings(
        bin_s=float(bin_s), run_s=setup.workload.duration_s,
        smooth_bins=point.get("read.smooth_bins", defaults.smooth_bins),
        smooth=point.get("read.smooth", defaults.smooth))
    try:  # the smoothing's own checks, before anything runs
        analysis.smooth_rates(pd.DataFrame({"tier": [], "bin_start_s": []}),
                              **settings.smoothing())
    except ValueError as err:
        raise ValueError(f"parameters 'read.smooth_bins' / 'read.smooth': {err}") from None
    return WhatIfRead(settings=settings, fill_store=fill_store)


def whatif_setup(point: Mapping[str, Any]) -> tuple[PointSetup, WhatIfRead]:
    """`point_setup` of a what-if point's run parameters, and how its run is read."""
    unknown = [k for k in point if k.startswith("read.") and k not in READ_KEYS]
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown}; known: {', '.join(READ_KEYS)}")
    setup = point_setup({k: v for k, v in point.items() if k not in READ_KEYS})
    return setup, _whatif_read(point, setup)


def saturation_headlines(result: Any, read: WhatIfRead) -> dict[str, float]:
    """Where one server's tier saturates: `peak_tok_s` (the highest bin of study A's
    throughput curve, `study_a_rates` with `read.settings`), `late_tok_s` (its
    plateau over the late window, `analysis.plateau` / `late_window`: the last third) and
    `fill_min` (`analysis.fill_time_s` of the fill store, exact from the run's stats; NaN:
    it never filled)."""
    rates = study_a_rates(result.records, read.settings)
    top = analysis.peak(rates, "total_tok_s")["peak_tok_s"]
    late = analysis.plateau(rates, "total_tok_s", *read.settings.after_window())
    fill_s = float("nan")
    if read.fill_store:
        fill_s = analysis.fill_time_s(result.samples, f"{read.fill_store}_bytes_used",
                                      stats=result.meta["stats"])
    return {"peak_tok_s": float(top.iloc[0]), "late_tok_s": float(late.iloc[0]),
            "fill_min": fill_s / 60}


@point_function(WHATIF_POINT_VERSION)
def whatif_point(point: Mapping[str, Any]) -> dict[str, Any]:
    """One server's twin run read for the what-if figure (notebook 07, `whatif-saturation`).

    Parameters: `default_point`'s for one server (no `n_servers` / `routing`), and how the
    run is read (`READ_KEYS`): `read.bin_s`, `read.smooth_bins`, `read.smooth` (defaults
    `StudyASettings`'), `read.fill_store` (default the tier's last store). Returns
    `default_point`'s columns (same run, same definitions: `ttft_median_s`, `cached_share`,
    throughput over the measurement window, cost), `saturation_headlines` (`peak_tok_s`,
    `late_tok_s`, `fill_min`) and `fill_store`.
    """
    from kvrepro.workload import generate_agentic

    setup, read = whatif_setup(point)
    result = _run_single(setup, generate_agentic(setup.workload))
    headlines = _single_headlines(setup, result)
    return {**headlines, **configuration_cost(setup, headlines["throughput_tok_s"]),
            **saturation_headlines(result, read), "fill_store": read.fill_store}


def check_whatif_point(point: Mapping[str, Any], where: str = "point") -> None:
    """Fail before a sweep starts on a point `whatif_point` cannot run."""
    try:
        whatif_setup(point)
    except (ValueError, FileNotFoundError) as err:
        raise ValueError(f"{where}: {err}") from err


whatif_point.check = check_whatif_point  # type: ignore[attr-defined]


def _server_parameter(server: str) -> str:
    """A shipped server's name as it is; a path made absolute (Ray workers may run elsewhere)."""
    from kvrepro.tier_spec import is_shipped_name

    if is_shipped_name(server):
        return server
    path = Path(server)
    if not path.is_file():
        raise FileNotFoundError(f"server spec not found: {server}")
    return str(path.resolve())


def whatif_grid(server: str, *, dram_gb: Sequence[float], flash_tb: Sequence[float],
                dram_ttl_s: Sequence[float], session_rates_per_min: Sequence[float],
                duration_s: float, bin_s: float, smooth_bins: int, seed: int = 0,
                pause: str = "study_a") -> tuple[list[Point], pd.DataFrame]:
    """Notebook 07's points: one knob changed per point from `server`'s spec, and their
    labels.

    Knobs: DRAM size (dram tier), flash size in TB (flash tier), a TTL on the DRAM store
    (dram tier) and the session rate (dram tier). Every point runs `duration_s` of the
    agentic load (`workload.pause`: `pause`, seed `seed`) and is read with `read.bin_s`
    and `read.smooth_bins`. Returns the points (for `run_sweep(..., point_fn=whatif_point)`)
    and a table `knob, value, point_id` in the figure's order (`whatif_table` joins them)."""
    common = {"server": _server_parameter(server), "seed": seed, "duration_s": duration_s,
              "workload.pause": pause, "read.bin_s": bin_s, "read.smooth_bins": smooth_bins}
    ttl = "server.tiers.dram.stores.0"
    knobs = [("DRAM (GB)", "dram", [({"dram_gb": g}, f"{g:g}") for g in dram_gb]),
             ("flash (TB)", "flash", [({"flash_gb": t * 1000}, f"{t:g}") for t in flash_tb]),
             ("DRAM TTL (min)", "dram", [({f"{ttl}.eviction": "ttl", f"{ttl}.ttl_s": t},
                                          f"{t / 60:g}") for t in dram_ttl_s]),
             ("sessions/min (DRAM tier)", "dram",
              [({"session_rate_per_min": r}, f"{r:g}") for r in session_rates_per_min])]
    points, labels = [], []
    for knob, tier, values in knobs:
        for change, label in values:
            point = {**common, "tier": tier, **change}
            points.append(point)
            labels.append({"knob": knob, "value": label, "point_id": point_id(point)})
    return expand_grid(points), pd.DataFrame(labels)


def whatif_table(labels: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """`whatif_grid`'s labels joined to a sweep's rows (`run_sweep`), in the labels' order;
    a failed or missing point is an error naming it (the figure would silently lack it)."""
    rows = table.set_index("point_id")
    missing = [p for p in labels.point_id if p not in rows.index]
    failed = [f"{p}: {rows.at[p, 'error']}" for p in labels.point_id
              if p in rows.index and rows.at[p, "status"] != "ok"]
    if missing or failed:
        raise RuntimeError(f"what-if sweep incomplete: missing points {missing}, failed "
                           f"points {failed}")
    return labels.merge(table, on="point_id", how="left", validate="one_to_one")
