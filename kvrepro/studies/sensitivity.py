"""Study A's sensitivities on the simulator: the same campaign with one thing changed.

Notebook 04 asks how study A's headlines move when one setting of the twin or the workload
changes: a load client that caps the requests in flight, a DRAM store that keeps what it
holds once full, another seed (LMCache's load mode is a free parameter of the calibration,
whose recorded effects at both modes notebook 04 shows: `calibration.result.effects`).
Each sweep here simulates only what changes (the tiers it concerns), keeps the base run's
other tiers beside them, reads the headlines with the notebook's `StudyASettings`
(`study_a_headlines`: the bins and smoothing its figures draw) and returns a `Sweep`: one
tidy frame, the `check_targets` table of every variant stacked with a column naming the
variant, and the variants' runs. `reproduced_by`, `met_by` and `met_matrix` reshape that
frame for display, so no notebook cell loops.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvrepro.engines.sim.campaign import simulate_campaign
from kvrepro.studies.reference import compare
from kvrepro.studies.study_a import check_targets, targets_met
from kvrepro.studies.study_a_headlines import StudyASettings, study_a_headlines
from kvrepro.tier_spec import ServerSpec, override_server
from kvrepro.workload.base import Workload

Run = tuple[pd.DataFrame, pd.DataFrame]
"""(records, samples) of one or more tiers, concatenated as `simulate_campaign` returns them."""


@dataclass(frozen=True)
class Sweep:
    """A sensitivity's result: `table` stacks each variant's `check_targets` table, with
    `column` naming the variant; `runs` holds what each variant simulated (the base variant
    is absent: it simulated nothing new)."""

    table: pd.DataFrame
    column: str
    runs: dict[Any, Run] = field(default_factory=dict)


def checked_headlines(run: Run, settings: StudyASettings) -> pd.DataFrame:
    """Study A's headlines of `run` next to the study's, with targets: what one variant of
    a sweep contributes (`study_a_headlines` -> `reference.compare` -> `check_targets`)."""
    records, samples = run
    return check_targets(compare(study_a_headlines(records, samples, settings)))


def swap_tiers(base: Run, variant: Run) -> Run:
    """`base` with every tier that `variant` holds replaced by the variant's run of it.

    Why: a sensitivity reruns only the tiers it changes (an offload flag leaves the
    baseline alone), but study A's headlines compare tiers, so the unchanged ones come from
    the base run of the same workload.
    """
    for name, frame in (("records", variant[0]), ("samples", variant[1])):
        if "tier" not in frame.columns:
            raise ValueError(f"swap_tiers: the variant's {name} have no 'tier' column")
    tiers = set(variant[0]["tier"]) | set(variant[1]["tier"])
    records = pd.concat([base[0][~base[0]["tier"].isin(tiers)], variant[0]], ignore_index=True)
    samples = pd.concat([base[1][~base[1]["tier"].isin(tiers)], variant[1]], ignore_index=True)
    return records, samples


def sweep_variants(base: Run, variants: Mapping[Any, Callable[[], Run] | None],
                   settings: StudyASettings, column: str) -> Sweep:
    """Run each variant (None: the base run itself), swap its tiers into `base`, and stack
    the checked headlines with `column` = the variant's label, in the order given."""
    tables, runs = [], {}
    for label, simulate in variants.items():
        run = base
        if simulate is not None:
            runs[label] = simulate()
            run = swap_tiers(base, runs[label])
        tables.append(checked_headlines(run, settings).assign(**{column: label}))
    return Sweep(pd.concat(tables, ignore_index=True), column, runs)


def _tiers(base: Run) -> list[str]:
    return list(dict.fromkeys(base[0]["tier"]))


def _simulate(workload: Workload, spec: ServerSpec, tiers: Sequence[str], warmup_s: float,
              max_in_flight: int | None = None) -> Callable[[], Run]:
    return lambda: simulate_campaign(workload, spec, list(tiers), warmup_s=warmup_s,
                                     progress=False, max_in_flight=max_in_flight)


def _limit_label(limit: int | None) -> str:
    return "none" if limit is None else str(int(limit))


def in_flight_sweep(workload: Workload, spec: ServerSpec, base: Run,
                    limits: Sequence[int | None], settings: StudyASettings,
                    warmup_s: float = 0.0, base_limit: int | None = None) -> Sweep:
    """The base run (its client cap `base_limit`, None: none) next to the same campaign under
    each other load-client concurrency limit (`max_in_flight`; None: no cap), all of the
    base's tiers (column `max_in_flight`: "none", "8", ...). Why: the study does not say
    whether its harness capped requests in flight, and a cap decides whether TTFT grows to
    minutes once a tier recomputes."""
    bad = [limit for limit in limits
           if limit is not None and (int(limit) != limit or limit < 1)]
    if bad:
        raise ValueError(f"parameter 'limits': in-flight limits must be integers >= 1 or "
                         f"None, got {bad}")
    variants: dict[Any, Callable[[], Run] | None] = {_limit_label(base_limit): None}
    for limit in limits:
        if _limit_label(limit) not in variants:
            variants[_limit_label(limit)] = _simulate(
                workload, spec, _tiers(base), warmup_s,
                max_in_flight=None if limit is None else int(limit))
    return sweep_variants(base, variants, settings, "max_in_flight")


def keeps_when_full(spec: ServerSpec, tier: str = "dram") -> ServerSpec:
    """`spec` with every store of `tier` keeping what it holds once full (`eviction: none`,
    a what-if: not LMCache's documented LRU)."""
    stores = spec.tier(tier).stores
    if not stores:
        raise ValueError(f"keeps_when_full: tier {tier!r} has no offload stores")
    return override_server(spec, {f"tiers.{tier}.stores.{i}.eviction": "none"
                                  for i in range(len(stores))})


def store_policy_sweep(workload: Workload, spec: ServerSpec, base: Run,
                       settings: StudyASettings, warmup_s: float = 0.0,
                       tier: str = "dram", max_in_flight: int | None = None) -> Sweep:
    """The base run next to one whose `tier` keeps what it holds once full (column
    `store_policy`: "LRU" / "keeps when full"; the run of `tier` is in `runs`;
    `max_in_flight` the base's client cap). Why:
    the study's DRAM tier kept part of its gain after filling, the twin's LRU store none."""
    if tier not in _tiers(base):
        raise ValueError(f"parameter 'tier': {tier!r} is not in the base run {_tiers(base)}")
    return sweep_variants(base, {"LRU": None, "keeps when full": _simulate(
        workload, keeps_when_full(spec, tier), [tier], warmup_s, max_in_flight)}, settings,
        "store_policy")


def seed_sweep(make_workload: Callable[[int], Workload], spec: ServerSpec, base: Run,
               base_seed: int, seeds: Sequence[int], settings: StudyASettings,
               warmup_s: float = 0.0, max_in_flight: int | None = None) -> Sweep:
    """The base run (workload seed `base_seed`) next to the same profile and workload rules
    on other seeds, all tiers (column `seed`; `max_in_flight` the base's client cap). Why:
    A5 rests on the handful of sessions that resume in every tier's run, so which targets a
    run meets depends partly on its seed."""
    variants: dict[Any, Callable[[], Run] | None] = {int(base_seed): None}
    for seed in seeds:
        if int(seed) in variants:
            raise ValueError(f"parameter 'seeds': seed {seed} given twice (or is base_seed)")
        variants[int(seed)] = _simulate(make_workload(int(seed)), spec, _tiers(base), warmup_s,
                                        max_in_flight)
    return sweep_variants(base, variants, settings, "seed")


# ---------------------------------------------------------------- views of a sweep

def _variants(sweep: Sweep) -> list[Any]:
    return list(dict.fromkeys(sweep.table[sweep.column]))


def reproduced_by(sweep: Sweep, ids: Sequence[str] = (),
                  figures: Sequence[str] = ()) -> pd.DataFrame:
    """Reproduced value per id (rows) and variant (columns, in sweep order), after a `study`
    column. Rows: the `ids` given and every id of the `figures` given ("A4", ...), in the
    sweep's order; all ids when both are empty. Ids a variant did not produce are NaN."""
    table = sweep.table
    unknown = sorted(set(ids) - set(table["id"]))
    if unknown:
        raise ValueError(f"parameter 'ids': {unknown} are in no variant of the sweep")
    if ids or figures:
        table = table[table["id"].isin(ids) | table["figure"].isin(figures)]
    order = list(dict.fromkeys(table["id"]))
    wide = table.pivot(index="id", columns=sweep.column, values="reproduced")
    wide = wide.reindex(index=order, columns=_variants(sweep))
    wide.insert(0, "study", table.groupby("id")["study"].first().reindex(order))
    wide.columns.name = sweep.column
    return wide


def met_by(sweep: Sweep) -> pd.DataFrame:
    """`targets_met` of each variant, one row each (index: the variant): predicted targets
    met / with a target, and the fitted or by-construction ones apart."""
    rows = {label: targets_met(sweep.table[sweep.table[sweep.column] == label])
            for label in _variants(sweep)}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = sweep.column
    return out


def met_matrix(sweep: Sweep) -> pd.DataFrame:
    """Whether each id with a target was met (rows) in each variant (columns), with its
    `kind` and `met in` ("k of n" variants)."""
    judged = sweep.table[sweep.table["met"].notna()]
    wide = judged.pivot(index="id", columns=sweep.column, values="met")
    wide = wide.reindex(index=list(dict.fromkeys(judged["id"])), columns=_variants(sweep))
    n_met = wide.isin([True]).sum(axis=1)
    wide.insert(0, "kind", judged.groupby("id")["kind"].first())
    wide["met in"] = n_met.astype(int).astype(str) + f" of {len(_variants(sweep))}"
    return wide
