"""Predicted vs published, per case and for all shipped cases: the `external.csv` table.

`predict_case(path)` reads a case, builds its server (`server_spec.case_server`), runs its
workload kind's runner (`experiments.EXPERIMENTS`) and returns one row per published number
(`TABLE_COLUMNS`): the published value, the twin's, the signed error, and whether the number
is predicted or fitted (its case, or the point, set a constant). `tier_effects(table)` pairs
each offload tier with the GPU-only one at every point and says whether the twin gets the
direction of the effect right.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from kvrepro.calc.gpu_rates import load_constants
from kvrepro.studies.external.case import ExternalCase, load_case, resolve_case, shipped_cases
from kvrepro.studies.external.experiments import EXPERIMENTS, PUBLISHED_FROM, CaseRun, key
from kvrepro.studies.external.server_spec import case_server
from kvrepro.tier_spec import HostCpuSpec

TABLE_COLUMNS = ["case", "metric", "tier", "point", "point_value", "unit", "published",
                 "predicted", "error_pct", "label", "read_off_figure", "cause",
                 "reference_tier"]
REFERENCE_TIERS = ("baseline", "hbm_only", "miss")
"""Where a case names no reference tier, the first of these it has is the one offload
tiers are compared with."""


def published_rows(case: ExternalCase, case_dir: Path):
    """The case's published numbers (from the file, or the probe's measurements)."""
    extra = PUBLISHED_FROM.get(case.workload.kind)
    return case.published + (extra(case, case_dir) if extra else [])


def _unit(metric: str) -> str:
    for suffix, unit in (("_tok_s", "tok/s"), ("_gb_s", "GB/s"), ("_s", "s")):
        if metric.endswith(suffix):
            return unit
    return ""


def _point(row) -> str:
    extra = "".join(f", {k}={v:g}" for k, v in sorted(row.extra.items()))
    return f"{row.point:g}{extra}"


def _cause(case: ExternalCase, metric: str, tier: str) -> str:
    return case.causes.get(f"{metric}/{tier}") or case.causes.get(metric) or ""


def predict_case(path: str | Path, run_dir: str | Path,
                 host: HostCpuSpec | None = None) -> pd.DataFrame:
    """One case's table (TABLE_COLUMNS); its run folder gets the twin's own files. `host`:
    the server's host CPUs for the twin's host model (None: not modelled, as published
    cases state no host CPU)."""
    src = resolve_case(str(path))
    case = load_case(src)
    out = Path(run_dir) / case.name
    out.mkdir(parents=True, exist_ok=True)
    constants = load_constants()
    server = case_server(case, constants)
    if host is not None:
        server = server.model_copy(update={"host_cpu": host})
    run = CaseRun(case, src.parent, server, constants, out)
    predicted = EXPERIMENTS[case.workload.kind](run)
    rows = []
    for p in published_rows(case, src.parent):
        value = predicted.get(key(p.metric, p.tier, p.point, **p.extra), math.nan)
        rows.append({"case": case.name, "metric": p.metric, "tier": p.tier,
                     "point": _point(p), "point_value": p.point, "unit": _unit(p.metric),
                     "published": p.value, "predicted": value,
                     "error_pct": 100 * (value - p.value) / p.value, "label": case.label(p),
                     "read_off_figure": p.read_off_figure,
                     "cause": _cause(case, p.metric, p.tier),
                     "reference_tier": case.reference_tier or ""})
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    table.to_csv(out / "external.csv", index=False)
    return table


def predict_all(run_dir: str | Path, cases: list[str] | None = None,
                progress: bool = True, host: HostCpuSpec | None = None) -> pd.DataFrame:
    """Every shipped case (or `cases`, names or paths), one table (`host`: predict_case's)."""
    names = list(shipped_cases()) if cases is None else cases
    parts = []
    for name in tqdm(names, desc="external cases", disable=not progress):
        start = time.monotonic()
        parts.append(predict_case(name, run_dir, host))
        if progress:
            tqdm.write(f"{name}: {time.monotonic() - start:.1f} s")
    return pd.concat(parts, ignore_index=True)


def host_cpu_effect(run_dir: str | Path, host: HostCpuSpec, cases: list[str] | None = None,
                    progress: bool = False) -> pd.DataFrame:
    """Each published point's prediction without and with the host-CPU model on `host`
    (`predicted`, `predicted_host`) and the change in % (`host_change_pct`): on a GPU
    server whose many CPUs the serving processes barely load, the model must leave the
    predictions where they were."""
    run_dir = Path(run_dir)
    plain = predict_all(run_dir / "plain", cases, progress)
    hosted = predict_all(run_dir / "host", cases, progress, host)
    keys = ["case", "metric", "tier", "point"]
    out = plain[[*keys, "published", "predicted"]].merge(
        hosted[[*keys, "predicted"]].rename(columns={"predicted": "predicted_host"}), on=keys)
    out["host_change_pct"] = 100 * (out["predicted_host"] - out["predicted"]) / out["predicted"]
    return out


def tier_effects(table: pd.DataFrame) -> pd.DataFrame:
    """Each offload tier against the case's reference tier (`reference_tier`, else GPU-only
    or a miss) at every
    point and metric both have: published and predicted ratio offload / reference, and
    whether the twin's effect goes the same way (lower latency, higher throughput)."""
    rows = []
    for (case, metric, point), group in table.groupby(["case", "metric", "point"], sort=False):
        by_tier = group.set_index("tier")
        named = group["reference_tier"].iloc[0] if "reference_tier" in group else ""
        candidates = (named,) if isinstance(named, str) and named else REFERENCE_TIERS
        ref = next((t for t in candidates if t in by_tier.index), None)
        if ref is None:
            continue
        for tier in by_tier.index:
            if tier in (ref, "gpu_hit", "device"):
                continue
            pub = by_tier.loc[tier, "published"] / by_tier.loc[ref, "published"]
            pred = by_tier.loc[tier, "predicted"] / by_tier.loc[ref, "predicted"]
            rows.append({"case": case, "metric": metric, "point": point,
                         "baseline_tier": ref, "offload_tier": tier,
                         "published_ratio": pub, "predicted_ratio": pred,
                         "direction_right": bool((pub - 1) * (pred - 1) > 0)})
    return pd.DataFrame(rows, columns=["case", "metric", "point", "baseline_tier",
                                       "offload_tier", "published_ratio", "predicted_ratio",
                                       "direction_right"])


def refit() -> Path:
    """Refit every fitted constant from its fit case and rewrite the frozen file."""
    from kvrepro.studies.external.constants import write_constants
    from kvrepro.studies.external.fs_path import fit_fs_path
    return write_constants(extra=fit_fs_path())
