"""A study's twin calibrated by a routine: free parameters searched on the Ray sweep, the best
values written back into the spec with their residuals.

A *calibration plan* is one YAML file per study (`data/studies/<study>.yaml`). It names the
study's server spec, the campaign the study runs (its workload and client: free-form, the
point function's business), the point function that runs one twin campaign, and under
`calibration`:

* `targets`: the reference ids the fit is judged on, each with why; these are the only ids
  of the study labelled `fitted` (`kvrepro.studies.provenance` reads them from here), every
  other id is a prediction;
* `fixed` (a plan's top level): the places that hold what the study states, a datasheet or
  a release's source gives, or the shared constants derive (`server:model`,
  `server:hardware`, `server:tiers.*.stores.*.capacity_bytes`), each with its source; a
  parameter that sets one of them, or a place inside one, is refused when the plan is read;
* `parameters`: the free parameters, each with the places it sets (`server:twin.mfu`,
  `campaign:workload.pause.mean_s`; one value may set several places, e.g. both offload
  tiers' load mode), the candidate values, its search `stage` and why it is free.

`calibrate` searches stage by stage: all combinations of one stage's candidates, the other
parameters at the best values found so far (the plan's current values before their stage),
each combination one point of `kvrepro.sweep.run_sweep` (resumable: a rerun with the same
plan and files runs only missing points; progress bar). A point's loss is the sum of its
targets' squared residuals (`residual_<id>` columns the point function returns, relative to
the target, 0 inside a bound). An unstated choice (a discrete parameter) is
made by the same evidence. Points are ranked first by how many targets lie beyond the
tolerance, then by the loss, so a point that meets every target wins over a lower loss that
does not. The winner's values are written into the server spec and the plan
(comments kept, each fitted value commented with its targets' residuals), and the plan's
`calibration.result` records every residual, the command and its wall time. Both files are
replaced together, atomically, under a lock each, once both new texts are checked
(`write_fit`); a plan is checked against its files when it is read (`load_plan`: every place
it sets is there), so a bad place fails before any point runs, not after the fit.

This module knows no study: what a point means is the point function's (named in the plan,
imported by name, so the calibration never imports the studies above it).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import itertools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from kvrepro._checks import load_yaml, load_yaml_model, validate_model
from kvrepro._files import rewriting
from kvrepro.sweep import Scalar, load_point_function, run_sweep
from kvrepro.tier_spec import set_dotted

RESIDUAL_PREFIX = "residual_"
"""Columns a calibration point function returns: `residual_<id>` for every target."""
PLACES = ("server", "campaign")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FreeParameter(_Strict):
    """One free parameter: its name, the places it sets, its candidates and why it is free."""

    name: str = Field(min_length=1)
    sets: list[str] = Field(min_length=1, description="server:<dotted path> or "
                            "campaign:<dotted path>, each set to the parameter's value")
    values: list[Scalar] = Field(min_length=1, description="the candidates searched")
    stage: int = Field(1, ge=1, description="searched with the other parameters of its stage")
    fits: list[str] = Field(min_length=1, description="the targets it mainly moves (its "
                            "comment in the spec shows their residuals)")
    why: str = Field(min_length=1, description="why it is free, and what it is fitted to")


class Calibration(_Strict):
    """The `calibration` section of a plan."""

    tolerance: float = Field(0.10, gt=0, description="a fitted target's allowed residual")
    seed: int = Field(0, ge=0, description="the workload seed the fit is judged on")
    rounds: int = Field(1, ge=1, description="passes over the stages (a later pass starts "
                        "from the earlier one's values)")
    targets: dict[str, str] = Field(min_length=1, description="fitted reference id -> why")
    beyond_reach: dict[str, str] = Field(default_factory=dict, description="targets the "
                                         "fixed facts keep outside the tolerance: id -> why, "
                                         "with the study's own arithmetic (the stale-fit "
                                         "guard checks that exactly these miss)")
    parameters: list[FreeParameter] = Field(min_length=1)
    result: dict[str, Any] = Field(default_factory=dict, description="written by calibrate")


class CalibrationPlan(_Strict):
    """A study's calibration plan (`data/studies/<study>.yaml`)."""

    description: str = ""
    server: str = Field(description="the study's server spec, relative to this file")
    point_function: str = Field(description="module:function running one twin campaign")
    headline_source: str = Field("", description="the notebook whose headline rows show the "
                                 "fit in `kvrepro reproduce` (another notebook may report "
                                 "the same id from other data)")
    campaign: dict[str, Any] = Field(default_factory=dict, description="the study's campaign "
                                     "(workload, client); the point function reads it")
    fixed: dict[str, str] = Field(default_factory=dict, description="place (fnmatch pattern "
                                  "of server:<dotted> / campaign:<dotted>) -> its source: "
                                  "stated facts no parameter may set")
    calibration: Calibration


def load_plan(path: str | Path) -> CalibrationPlan:
    """Read a plan, checked against its server spec (`_check_plan`); errors name the file
    and each bad key's dotted path."""
    plan = load_yaml_model(path, CalibrationPlan, "calibration plan")
    _check_plan(plan, Path(path), _server_tree(path, plan))
    return plan


def _plan_from_text(text: str, path: Path, server: Any) -> CalibrationPlan:
    """A plan's text (one about to be written as `path`) read as `load_plan` reads the file,
    checked against the server tree `server`."""
    plan = validate_model(load_yaml(text, str(path)), CalibrationPlan, "calibration plan",
                          str(path))
    _check_plan(plan, path, server)
    return plan


def _server_tree(plan_path: str | Path, plan: CalibrationPlan) -> Any:
    """The plan's server spec as parsed YAML; a missing one is named with the plan."""
    path = server_path(plan_path, plan)
    if not path.is_file():
        raise FileNotFoundError(f"{plan_path}: its server spec {plan.server!r} is not a file "
                                f"({path})")
    return load_yaml(path.read_text(), str(path))


def _check_plan(plan: CalibrationPlan, path: Path, server: Any) -> None:
    """Every parameter fits declared targets, and every place it sets exists in the server
    spec or the campaign. Why before any point runs: a place that is not there fails only
    at the write-back, after the whole fit (a KeyError that loses it)."""
    trees = {"server": server, "campaign": plan.campaign}
    stray = sorted(set(plan.calibration.beyond_reach) - set(plan.calibration.targets))
    if stray:
        raise ValueError(f"{path}: calibration.beyond_reach names {stray}, which are not "
                         "calibration.targets")
    for param in plan.calibration.parameters:
        _check_not_fixed(plan, path, param)
        unknown = sorted(set(param.fits) - set(plan.calibration.targets))
        if unknown:
            raise ValueError(f"{path}: parameter {param.name!r} fits {unknown}, which are not "
                             "calibration.targets")
        for place in param.sets:
            where, _, dotted = place.partition(":")
            if where not in PLACES or not dotted:
                raise ValueError(f"{path}: parameter {param.name!r}: place {place!r} is not "
                                 f"one of {PLACES} followed by ':' and a dotted path")
            missing = _missing_key(trees[where], dotted)
            if missing is not None:
                owner = (f"the server spec {plan.server}" if where == "server"
                         else "the plan's campaign")
                raise ValueError(f"{path}: parameter {param.name!r}: place {place!r}: "
                                 f"{owner} has no key {missing!r} (a calibration sets only "
                                 "keys that are written there)")


def fixed_place(plan: CalibrationPlan, place: str) -> str | None:
    """The `fixed` pattern that holds `place` (the place itself, or a place above it), or
    None when the place is free to set."""
    parts = place.split(".")
    for pattern in plan.fixed:
        if any(fnmatch.fnmatchcase(".".join(parts[:n]), pattern)
               for n in range(1, len(parts) + 1)):
            return pattern
    return None


def _check_not_fixed(plan: CalibrationPlan, path: Path, param: FreeParameter) -> None:
    """Why: a fit that moves a stated fact (a KV dtype, a capacity, a GPU) can meet its
    targets for the wrong reason; the plan's `fixed` list is what it may never touch."""
    for place in param.sets:
        pattern = fixed_place(plan, place)
        if pattern is not None:
            raise ValueError(f"{path}: parameter {param.name!r} sets {place!r}, a fixed "
                             f"place ({pattern!r}: {plan.fixed[pattern]})")


def _missing_key(tree: Any, dotted: str) -> str | None:
    """The first prefix of `dotted` that `tree` does not hold (a number indexes a list,
    within its length), or None when the whole path is there."""
    keys = dotted.split(".")
    node = tree
    for i, key in enumerate(keys):
        if isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            return ".".join(keys[:i + 1])
    return None


def server_path(plan_path: str | Path, plan: CalibrationPlan) -> Path:
    return (Path(plan_path).parent / plan.server).resolve()


def _get(tree: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        tree = tree[int(key)] if isinstance(tree, list) else tree[key]
    return tree


def current_values(plan_path: str | Path) -> dict[str, Any]:
    """Each free parameter's value in the shipped files (its first place; `load_plan` has
    checked that every place is there)."""
    plan = load_plan(plan_path)
    trees = {"server": _server_tree(plan_path, plan), "campaign": plan.campaign}
    out = {}
    for param in plan.calibration.parameters:
        where, _, dotted = param.sets[0].partition(":")
        out[param.name] = _get(trees[where], dotted)
    return out


def apply_point(plan_path: str | Path, point: Mapping[str, Any]
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(server tree, campaign tree) of the plan with a point's parameter values set.

    What a calibration point function starts from: parameters not in the point keep the
    files' values; keys of the point that name no parameter (`plan`, `seed`) are ignored."""
    import yaml

    plan = load_plan(plan_path)
    server = yaml.safe_load(server_path(plan_path, plan).read_text())
    campaign = dict(plan.campaign)
    trees = {"server": server, "campaign": campaign}
    for param in plan.calibration.parameters:
        if param.name in point:
            for place in param.sets:
                where, _, dotted = place.partition(":")
                set_dotted(trees[where], dotted, point[param.name])
    return server, campaign


def residual(value: float, target: float, rule: str = "rel") -> float:
    """A fitted value's residual, relative to its target: (value - target) / |target| for a
    level ("rel"), the excess beyond a bound for "max" / "min" (0 inside it)."""
    if value is None or not math.isfinite(value):
        return math.inf
    rel = (value - target) / abs(target)
    if rule == "max":
        return max(rel, 0.0)
    if rule == "min":
        return min(rel, 0.0)
    return rel


def loss(row: Mapping[str, Any], targets: list[str]) -> float:
    """Sum of squared residuals of a point's row (inf when a residual is missing or NaN)."""
    total = 0.0
    for ref_id in targets:
        value = row.get(RESIDUAL_PREFIX + ref_id)
        if value is None or not math.isfinite(float(value)):
            return math.inf
        total += float(value) ** 2
    return total


def outside(row: Mapping[str, Any], targets: list[str], tolerance: float) -> int:
    """How many of a point's targets lie beyond the tolerance (a missing one counts)."""
    values = [row.get(RESIDUAL_PREFIX + t) for t in targets]
    return sum(1 for v in values if v is None or not abs(float(v)) <= tolerance)


@dataclass(frozen=True)
class CalibrationResult:
    """What `calibrate` found: the chosen values, the winner's residuals, every point run."""

    values: dict[str, Any]
    residuals: dict[str, float]
    points: pd.DataFrame
    wall_s: float
    points_run: int = 0
    """Points this call ran (the others were read back from the sweep folders)."""
    effects: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    """parameter -> its value (as text) -> its `fits` targets' headlines, with the other
    parameters at the fitted values: what each freed parameter moves (`_effects`)."""


def _folder_key(plan_path: Path, plan: CalibrationPlan) -> str:
    """The plan's and server's text without the written result: a rerun after a write-back
    that changed nothing else reuses the finished points."""
    text = plan.model_dump_json(exclude={"calibration": {"result"}})
    server = server_path(plan_path, plan).read_text()
    return hashlib.sha256((text + server).encode()).hexdigest()[:12]


def _stage_points(plan: CalibrationPlan, stage: int, best: dict[str, Any],
                  plan_path: Path) -> list[dict[str, Any]]:
    params = [p for p in plan.calibration.parameters if p.stage == stage]
    names = [p.name for p in params]
    points = []
    for combo in itertools.product(*(p.values for p in params)):
        point = {**best, **dict(zip(names, combo, strict=True))}
        points.append({**point, "plan": str(plan_path), "seed": plan.calibration.seed})
    return points


def calibrate(plan_path: str | Path, out_dir: str | Path | None = None, *,
              max_parallel: int | None = None, progress: bool = True,
              write: bool = True) -> CalibrationResult:
    """Fit a plan's free parameters stage by stage on the Ray sweep (see the module).

    `out_dir`: where the stages' sweep folders go (default `runs/calibrate/<plan>-<key>`,
    the key a hash of the plan and server files, so a rerun resumes and a changed file starts
    afresh). `write`: put the values and residuals into the server spec and the plan."""
    started = time.perf_counter()
    plan_path = Path(plan_path).resolve()
    plan = load_plan(plan_path)
    fn = load_point_function(plan.point_function)
    targets, tol = list(plan.calibration.targets), plan.calibration.tolerance
    out = Path(out_dir or Path("runs", "calibrate",
                               f"{plan_path.stem}-{_folder_key(plan_path, plan)}"))
    best = {k: v for k, v in current_values(plan_path).items() if v is not None}
    tables, winner, ran = [], None, 0
    stages = sorted({p.stage for p in plan.calibration.parameters})
    for round_, stage in itertools.product(range(1, plan.calibration.rounds + 1), stages):
        folder = out / (f"stage{stage}" if round_ == 1 else f"round{round_}-stage{stage}")
        table = run_sweep(_stage_points(plan, stage, best, plan_path), folder,
                          point_fn=fn, max_parallel=max_parallel, progress=progress)
        ran += int(table.attrs.get("ran", len(table)))
        rows = table.to_dict("records")
        table = table.assign(round=round_, stage=stage,
                             outside=[outside(r, targets, tol) for r in rows],
                             loss=[loss(r, targets) for r in rows])
        ok = table[table["status"] == "ok"]
        if ok.empty:
            raise RuntimeError(f"calibration stage {stage}: every point failed; first error: "
                               f"{table['error'].iloc[0]}")
        winner = ok.sort_values(["outside", "loss"], kind="stable").iloc[0]
        best.update({p.name: _candidate(p, winner[p.name]) for p in plan.calibration.parameters
                     if p.stage == stage})
        tables.append(table)
    residuals = {t: float(winner[RESIDUAL_PREFIX + t]) for t in targets}
    effects, effect_table = _effects(plan, plan_path, best, winner, out, fn, max_parallel,
                                     progress)
    ran += int(effect_table.attrs.get("ran", len(effect_table)))
    result = CalibrationResult(best, residuals, pd.concat(tables, ignore_index=True),
                               time.perf_counter() - started, ran, effects)
    if write:
        write_fit(plan_path, result)
    return result


def extreme_candidates(values: list[Any]) -> list[Any]:
    """A parameter's candidates at either end of its list (null first, when it is one)."""
    ordered = [v for v in values if v is not None]
    ends = [v for v in values if v is None] + ([min(ordered), max(ordered)] if ordered else [])
    return list(dict.fromkeys(ends))


def _effects(plan: CalibrationPlan, plan_path: Path, best: dict[str, Any], winner: Any,
             out: Path, fn: Any, max_parallel: int | None, progress: bool
             ) -> tuple[dict[str, dict[str, dict[str, float]]], pd.DataFrame]:
    """Each parameter at its extreme candidates, the others at the fitted values (one more
    sweep, `effects/`), with the winner's own headlines for the fitted value. Why recorded:
    "what each freed parameter moves" is part of the fit, and a notebook reads it instead
    of running the campaigns again."""
    base = {"plan": str(plan_path), "seed": plan.calibration.seed}
    points = [{**best, param.name: value, **base} for param in plan.calibration.parameters
              for value in extreme_candidates(param.values) if value != best[param.name]]
    table = run_sweep(points, out / "effects", point_fn=fn, max_parallel=max_parallel,
                      progress=progress) if points else pd.DataFrame()
    rows = table.to_dict("records")
    effects: dict[str, dict[str, dict[str, float]]] = {}
    for param in plan.calibration.parameters:
        moved = {str(best[param.name]): {t: float(winner.get(t, math.nan)) for t in param.fits}}
        for row in rows:
            if _candidate(param, row[param.name]) != best[param.name] and all(
                    _candidate(p, row[p.name]) == best[p.name]
                    for p in plan.calibration.parameters if p is not param):
                moved[str(_candidate(param, row[param.name]))] = {
                    t: float(row.get(t, math.nan)) for t in param.fits}
        effects[param.name] = moved
    return effects, table


def _candidate(param: FreeParameter, cell: Any) -> Any:
    """The candidate a table cell holds, as the plan spells it (a column mixing null and
    integers reads back as floats with NaN)."""
    value = cell.item() if hasattr(cell, "item") else cell
    for candidate in param.values:
        if candidate is None and (value is None or (isinstance(value, float)
                                                    and math.isnan(value))):
            return None
        if candidate is not None and value is not None and candidate == value:
            return candidate
    raise ValueError(f"parameter {param.name!r}: {cell!r} is none of its candidates")


# ------------------------------------------------------------------ writing the fit back


def _yaml() -> Any:
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096  # a flow list is never wrapped (ruamel leaves a trailing blank)
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.representer.add_representer(float, _represent_float)
    return yaml


def _represent_float(representer: Any, value: float) -> Any:
    return representer.represent_scalar("tag:yaml.org,2002:float", _float_text(value))


def _float_text(value: float) -> str:
    """A float as a person writes it, and as PyYAML reads it back as the same float: 0.34,
    9.5e+09 (a dot in the mantissa and a signed exponent, YAML 1.1's float), with as few
    digits as give the value exactly (the write-back's check compares what it reads back)."""
    if not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    if value == 0 or 1e-5 <= abs(value) < 1e5:
        for text in (repr(round(value, 6)), repr(value)):
            if "e" not in text and float(text) == value:
                return text
    for digits in range(4, 17):
        mantissa, _, exponent = f"{value:.{digits}e}".partition("e")
        if float(f"{mantissa}e{exponent}") == value:
            break
    mantissa = mantissa.rstrip("0")
    return f"{mantissa}0e{exponent}" if mantissa.endswith(".") else f"{mantissa}e{exponent}"


def _comment(param: FreeParameter, residuals: Mapping[str, float]) -> str:
    shown = ", ".join(f"{t} {100 * residuals[t]:+.1f} %" for t in param.fits)
    return f"fitted (kvrepro calibrate): {shown}"


def _set_commented(tree: Any, dotted: str, value: Any, comment: str) -> None:
    *parents, last = dotted.split(".")
    node = tree
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    key = int(last) if isinstance(node, list) else last
    node[key] = value
    if hasattr(node, "fa"):
        node.fa.set_block_style()
    node.yaml_add_eol_comment(comment, key)


def _block_mappings(node: Any) -> None:
    """Every mapping in block style (one key per line), so a written file reads the same
    whichever of its values changed; lists keep their style."""
    if hasattr(node, "items"):
        if hasattr(node, "fa"):
            node.fa.set_block_style()
        for value in node.values():
            _block_mappings(value)
    elif isinstance(node, list):
        for value in node:
            _block_mappings(value)


def write_fit(plan_path: str | Path, result: CalibrationResult) -> None:
    """Write the fitted values (commented with the residuals) into the server spec and the
    plan, and the plan's `calibration.result`; the files' other comments are kept.

    Both files are read, changed and replaced under their locks (`kvrepro._files.rewriting`):
    a second calibration of a plan sharing the server waits, then reads the first one's
    values and keeps them. Both new texts are checked (`_check_fit`) before either file is
    replaced, each atomically: a full disk or a value the spec refuses leaves both as they
    were."""
    plan_path = Path(plan_path).resolve()
    server = server_path(plan_path, load_plan(plan_path))
    with rewriting([server, plan_path]) as replace:
        plan = load_plan(plan_path)  # again, under the locks: a write since then is kept
        if server_path(plan_path, plan) != server:
            raise ValueError(f"{plan_path}: its server changed while the fit ran; nothing "
                             "written, run calibrate again")
        texts = _fitted_texts(plan_path, plan, result)
        replace(texts, check=lambda new: _check_fit(new, plan_path, server, result))


def _fitted_texts(plan_path: Path, plan: CalibrationPlan, result: CalibrationResult
                  ) -> dict[Path, str]:
    """The server spec's and the plan's new texts, fitted values and result written in."""
    yaml = _yaml()
    files = {"server": server_path(plan_path, plan), "campaign": plan_path}
    trees = {where: yaml.load(path.read_text()) for where, path in files.items()}
    for param in plan.calibration.parameters:
        note = _comment(param, result.residuals)
        for place in param.sets:
            where, _, dotted = place.partition(":")
            tree = trees[where] if where == "server" else trees["campaign"]["campaign"]
            _set_commented(tree, dotted, result.values[param.name], note)
    trees["campaign"]["calibration"]["result"] = {
        "command": f"kvrepro calibrate --plan {_shown(plan_path)}",
        "seed": plan.calibration.seed,
        "values": dict(result.values),
        "residual_pct": {t: round(100 * r, 2) for t, r in result.residuals.items()},
        "effects": {name: {value: {t: round(v, 4) for t, v in targets.items()}
                           for value, targets in moved.items()}
                    for name, moved in result.effects.items()},
        "points": int(len(result.points)),
        "points_run": result.points_run,
        "wall_s": round(result.wall_s, 1)}
    texts = {}
    for where, path in files.items():
        _block_mappings(trees[where])
        buffer = io.StringIO()
        yaml.dump(trees[where], buffer)
        texts[path] = buffer.getvalue()
    return texts


def _check_fit(new: Mapping[Path, bytes], plan_path: Path, server: Path,
               result: CalibrationResult) -> None:
    """Before anything is replaced: the new server text is a server spec, the new plan text
    a plan (its places all there), and every place and `calibration.result` reads back the
    fitted value, of the same type. Else ValueError naming the file; nothing is written."""
    from kvrepro.tier_spec import ServerSpec

    tree = load_yaml(new[server].decode(), str(server))
    validate_model(tree, ServerSpec, "server spec", str(server))
    written = _plan_from_text(new[plan_path].decode(), plan_path, tree)
    trees = {"server": tree, "campaign": written.campaign}
    for param in written.calibration.parameters:
        wanted = result.values[param.name]
        for place in param.sets:
            where, _, dotted = place.partition(":")
            got = _get(trees[where], dotted)
            if type(got) is not type(wanted) or got != wanted:
                raise ValueError(f"{server if where == 'server' else plan_path}: {dotted} "
                                 f"would read back as {got!r}, not the fitted {wanted!r}; "
                                 "nothing written")
    if written.calibration.result.get("values") != dict(result.values):
        raise ValueError(f"{plan_path}: calibration.result.values would not read back as the "
                         "fitted values; nothing written")


def _shown(path: Path) -> str:
    """A path relative to the working folder where it lies below it (as a user types it)."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def fit_table(plan_path: str | Path, residuals: Mapping[str, float]) -> pd.DataFrame:
    """id, residual_pct, within (the plan's tolerance), beyond_reach (declared so by the
    plan), why: one row per fitted target."""
    plan = load_plan(plan_path)
    tol = plan.calibration.tolerance
    rows = [{"id": t, "residual_pct": 100 * residuals.get(t, math.nan),
             "within": bool(abs(residuals.get(t, math.inf)) <= tol),
             "beyond_reach": t in plan.calibration.beyond_reach, "why": why}
            for t, why in plan.calibration.targets.items()]
    return pd.DataFrame(rows)
