"""Command line.

  kvrepro reproduce [--only NAME] [-p key=value]      run every notebook, figures + numbers
  kvrepro run live --server FILE [--tier NAME] [-p key=value] ...  deploy vLLM tiers, replay
      [--dry-run]                                  write + print the commands, start nothing
  kvrepro doctor --server FILE [--tier NAME] [-p key=value]   preflight of a server (exit 1: fail)
  kvrepro run sim --server FILE [--tier NAME] [-p key=value] ...   the same on the simulator
      [--flash-profile MEASURED.yaml [--flash-store NAME]]          with a measured flash tier
  kvrepro run fleet --fleet FILE [-p key=value] [--routing R] [--kv-pool P] ...  a live fleet
  kvrepro sweep GRID.yaml --out DIR [--address ADDR] [--max-parallel N]   twin runs on Ray
  kvrepro calibrate --plan data/studies/study_a.yaml | --server FILE   refit a study's twin
"""

from __future__ import annotations

import argparse
import datetime as dt
import errno
import math
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import Any, NoReturn

from kvrepro._paths import RefusedFolder
from kvrepro.studies import reference


def _reproduce(args: argparse.Namespace) -> int:
    from kvrepro.reproduce import parse_overrides, reproduce

    try:  # a bad input raises on to `main`, which prints it as one line
        overrides = parse_overrides(args.param)
        result = reproduce(args.notebooks, args.figures, args.runs, args.only, overrides,
                           jobs=args.jobs)
    except KeyboardInterrupt as err:
        print(f"kvrepro reproduce: stopped ({err or 'interrupted'}); the notebooks that "
              f"finished are in {args.runs}/<newest>/, their times in timings.csv",
              file=sys.stderr)
        return 130
    print(f"\nExecuted notebooks: {result.run_dir}/")
    print(f"Figures: {args.figures}/")
    print("\nHeadline numbers, reproduced vs the studies' values "
          f"({result.run_dir / 'headline_numbers.csv'}):\n")
    print(reference.format_headlines(result.headlines))
    if not result.headlines.empty:
        from kvrepro.studies.provenance import KINDS, count_by_kind

        print("\nBy kind (only `predicted` numbers count as reproduced):\n")
        print(count_by_kind(result.headlines).to_string(index=False))
        for kind, meaning in KINDS.items():
            print(f"  {kind:9s} {meaning}")
    if not result.headlines.empty:
        _print_fits(result.headlines)
    if result.validation is not None:
        from kvrepro.calibration.validate import summary_table

        print(f"\nDigital twin vs live runs ({result.run_dir / 'validation.csv'}): metrics "
              "within 10 %, median |error|\n")
        print(summary_table(result.validation).round(1).to_string(index=False))
    if result.report is not None:
        print(f"\nReport: {result.report}")
    for failure in result.failures:
        print(f"\nFAILED: {failure}", file=sys.stderr)
    if args.store_checked_outputs and not result.failures:
        from kvrepro.reproduce import store_checked_outputs

        for executed in result.executed:
            count = store_checked_outputs(executed, Path(args.notebooks) / executed.name)
            print(f"stored {count} checked output(s) in {Path(args.notebooks) / executed.name}")
    return 1 if result.failures else 0


def _check_tiers(names: list[str], known: Any, source: str) -> None:
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"--tier {unknown} not in {source}; known: {sorted(known)}")


def _workload(args: argparse.Namespace) -> Any:
    """The workload of a `run` command: a saved folder, or generated from -w parameters (a
    bad one is a line per key, `-w duration_s: Input should be a valid number ...`)."""
    from pydantic import ValidationError

    from kvrepro._checks import validation_problems
    from kvrepro.reproduce import parse_overrides
    from kvrepro.workload import build_workload, load_workload

    if args.workload_dir:
        return load_workload(args.workload_dir)
    try:
        return build_workload(args.workload, parse_overrides(args.workload_param))
    except ValidationError as err:
        raise ValueError(validation_problems(err, "-w ")) from err


_NEW_FOLDER_TRIES = 20


def _out_dir(given: str | None, engine: str) -> Path:
    """`--out` as given, or a new folder `runs/<engine>-<UTC time>-<pid>-<random>`; made and
    proven writable here, before any work. Why: `--out` on a file, on a read-only filesystem
    or in /proc (or `runs` a file) failed with a traceback, a simulation's only after it ran."""
    folder = _made_folder(Path(given), "--out") if given else _new_run_folder(engine)
    _prove_writable(folder, "--out" if given else "run folder")
    return folder


def _os_error(err: OSError, what: str, path: Path | None = None) -> OSError:
    """`err` again (same errno, so the same subclass), saying which folder it is about."""
    return OSError(err.errno, f"{err.strerror} ({what})", str(path or err.filename))


def _made_folder(path: Path, what: str) -> Path:
    """`path` as a folder, made with its parents if missing; OSError naming it otherwise."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # mkdir's answer for a file of that name
        raise NotADirectoryError(errno.ENOTDIR, f"not a folder ({what})", str(path)) from None
    except OSError as err:
        raise _os_error(err, f"cannot make the folder, {what}") from None
    return path


def _prove_writable(folder: Path, what: str) -> None:
    """Make and remove a file of ours in `folder` (`kvrepro._files.own_file`): a read-only
    filesystem, or one that takes no files, is refused now, naming `folder`."""
    from kvrepro._files import own_file

    try:
        with own_file(folder, ".kvrepro-write-test-", os.O_WRONLY):
            pass
    except OSError as err:
        raise _os_error(err, f"cannot write files there, {what}", folder) from None


def _new_run_folder(engine: str) -> Path:
    """A new folder `runs/<engine>-<UTC time>-<pid>-<random>`, created here (exist_ok=False,
    retried) so that two runs started in the same second never share one: the second used to
    crash into the first's run folder."""
    _made_folder(Path("runs"), "where run folders go without --out")
    for _ in range(_NEW_FOLDER_TRIES):
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        folder = Path("runs") / f"{engine}-{stamp}-{os.getpid()}-{secrets.token_hex(2)}"
        try:
            folder.mkdir(exist_ok=False)
        except FileExistsError:
            continue
        except OSError as err:
            raise _os_error(err, "cannot make a run folder; pass --out") from None
        return folder
    raise RefusedFolder(f"runs/: no new {engine}-<time> folder after {_NEW_FOLDER_TRIES} "
                        "tries; pass --out")


def _server(args: argparse.Namespace) -> Any:
    """The server spec of a `run` command, with its -p what-if overrides."""
    from kvrepro.reproduce import parse_overrides
    from kvrepro.tier_spec import load_server, override_server

    return override_server(load_server(args.server), parse_overrides(args.param))


def _run_live(args: argparse.Namespace) -> int:
    from kvrepro.engines.live.runner import LiveOptions, run_campaign
    from kvrepro.engines.live.tiers import live_tiers

    tiers = live_tiers(_server(args))  # a bad input raises; `main` prints it as one line
    names = args.tier or list(tiers)
    _check_tiers(names, tiers, args.server)
    workload = None if args.dry_run else _workload(args)
    if args.dry_run:
        from kvrepro.engines.live.runner import dry_run_campaign

        out = _out_dir(args.out, "live-dry-run")
        print(dry_run_campaign([tiers[n] for n in names], out), end="")
        print(f"dry run: nothing started; written to {out}/ (dry_run.txt, one folder per tier)")
        return 0
    out = _out_dir(args.out, "live")
    options = LiveOptions(duration_s=args.duration_s, warmup_s=args.warmup_s,
                          request_timeout_s=args.request_timeout_s,
                          sample_interval_s=args.sample_interval_s,
                          max_in_flight=args.max_in_flight)
    results = run_campaign([tiers[n] for n in names], workload, out, options)
    failed = 0
    for name, result in results.items():
        if isinstance(result, Exception):
            failed += 1
            print(f"tier {name}: FAILED: {result}", file=sys.stderr)
        else:
            print(f"tier {name}: {result.requests_ok} ok, {result.requests_failed} failed "
                  f"-> {out / name}/records.jsonl")
    return 1 if failed else 0


def _doctor(args: argparse.Namespace) -> int:
    """Under `stop_on_signals`: SIGTERM / SIGINT (e.g. `timeout`) remove the probe file and the
    folders the checks made before the doctor exits (128 + the signal)."""
    import json

    from kvrepro._files import replace_file
    from kvrepro._signals import stop_on_signals
    from kvrepro.engines.live.doctor import as_records, doctor, format_checks, json_target_problem

    problem = args.json and json_target_problem(args.json)
    if problem:
        print(f"kvrepro doctor: {problem}", file=sys.stderr)
        return 2
    with stop_on_signals() as seen:
        try:
            checks = doctor(_server(args), args.tier, args.runs_dir)
        except (ValueError, FileNotFoundError) as err:
            print(f"kvrepro doctor: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as err:
            print(f"kvrepro doctor: stopped ({err or 'interrupted'}); its probe file and the "
                  "folders it made are removed", file=sys.stderr)
            return 128 + (seen[-1] if seen else 2)
    print(format_checks(checks))
    if args.json:
        try:
            replace_file(args.json, json.dumps(as_records(checks), indent=2) + "\n")
        except OSError as err:
            print(f"kvrepro doctor: --json {args.json}: {err.strerror or err}", file=sys.stderr)
            return 2
    return 0 if all(c.ok for c in checks) else 1


def _add_doctor_parser(sub: argparse._SubParsersAction) -> None:
    doc = sub.add_parser("doctor", help="check a server before a live campaign: GPUs or CPUs, "
                                        "memory, flash folders, fio, port, versions, model "
                                        "(exit status 1 when a check fails)")
    doc.add_argument("--server", required=True, help="server spec, e.g. "
                                                      "data/servers/study_a.yaml")
    doc.add_argument("--tier", action="append", help="tier to check (repeatable; default: all)")
    doc.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                     help="server spec override, as `run live` takes them")
    doc.add_argument("--runs-dir", default="runs", help="where run folders go: a flash store "
                     "without a path writes inside its run folder (default: runs)")
    doc.add_argument("--json", help="also write the checks to this JSON file")
    doc.set_defaults(func=_doctor)


def _run_fleet(args: argparse.Namespace) -> int:
    from kvrepro.engines.live import fleet_deploy as live_fleet
    from kvrepro.fleet_spec import load_fleet
    from kvrepro.reproduce import parse_overrides

    spec = live_fleet.override_fleet(load_fleet(args.fleet), parse_overrides(args.param),
                                     args.fleet)  # a bad input raises; `main` prints it
    fleets = live_fleet.fleet_grid(spec, args.routing, args.kv_pool)
    workload = None if args.dry_run else _workload(args)
    options = live_fleet.FleetOptions(
        duration_s=args.duration_s, warmup_s=args.warmup_s,
        request_timeout_s=args.request_timeout_s, sample_interval_s=args.sample_interval_s,
        max_in_flight=args.max_in_flight, router=args.router, pin_cpus=not args.no_pin_cpus)
    if args.dry_run:
        out = _out_dir(args.out, "fleet-dry-run")
        print(live_fleet.dry_run_fleet_campaign(fleets, out, options), end="")
        print(f"dry run: nothing started; written to {out}/ (dry_run.txt, one folder per fleet)")
        return 0
    out = _out_dir(args.out, "fleet")
    results = live_fleet.run_fleet_campaign(fleets, workload, out, options)
    for name, result in results.items():
        if isinstance(result, Exception):
            print(f"fleet {name}: FAILED: {result}", file=sys.stderr)
        else:
            print(f"fleet {name}: {result.requests_ok} ok, {result.requests_failed} failed "
                  f"-> {out / name}/records.jsonl")
    return 1 if any(isinstance(r, Exception) for r in results.values()) else 0


def _add_fleet_parser(engines: argparse._SubParsersAction) -> None:
    fleet = engines.add_parser("fleet", help="deploy a live fleet (N vLLM instances, LMCache, "
                                             "vllm-router) and drive it")
    fleet.add_argument("--fleet", required=True, help="fleet spec, e.g. "
                                                      "data/fleets/cpu_tiny_2x.yaml")
    fleet.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                       help="fleet spec override (routing=prefix_aware, kv_pool=private, "
                            "tier=flash; repeatable)")
    fleet.add_argument("--routing", action="append", choices=["round_robin",
                       "session_affinity", "prefix_aware"],
                       help="one run per routing policy (repeatable; default: the spec's)")
    fleet.add_argument("--kv-pool", action="append", choices=["shared", "private"],
                       help="one run per pool kind (repeatable; default: the spec's)")
    fleet.add_argument("--router", choices=["vllm-router", "client"], default="vllm-router",
                       help="vllm-router, or the load client's own routing")
    fleet.add_argument("--no-pin-cpus", action="store_true",
                       help="let every instance use every core (default: instance i on "
                            "CPU i mod cores)")
    _add_workload_args(fleet)
    fleet.add_argument("--request-timeout-s", type=_positive_s, default=600.0)
    fleet.add_argument("--sample-interval-s", type=_positive_s, default=2.0)
    fleet.add_argument("--out", help="campaign folder (default: new runs/fleet-<UTC time>-<id>)")
    fleet.add_argument("--dry-run", action="store_true",
                       help="write and print every command line, environment and config file "
                            "of every process into the run folder; start nothing")
    fleet.set_defaults(func=_run_fleet)


def _with_flash_profile(profile: Any, args: argparse.Namespace) -> Any:
    """`--flash-profile FILE`: the measured flash tier (kvrepro.storage) in the named stores."""
    if not args.flash_profile:
        return profile
    from kvrepro.storage.profile import load_flash_profile
    from kvrepro.studies.flash_profile import apply_flash_profile

    return apply_flash_profile(profile, load_flash_profile(args.flash_profile),
                               store=args.flash_store or "flash")


def _run_sim(args: argparse.Namespace) -> int:
    from kvrepro import analysis
    from kvrepro.engines.sim import sim_profile
    from kvrepro.engines.sim.campaign import simulate_campaign

    profile = _with_flash_profile(sim_profile(_server(args)), args)  # `main` prints errors
    _check_tiers(args.tier or [], profile.tiers, args.server)
    workload = _workload(args)
    out = _out_dir(args.out, "sim")
    records, _ = simulate_campaign(workload, profile, args.tier, out, warmup_s=args.warmup_s,
                                   duration_s=args.duration_s, max_in_flight=args.max_in_flight)
    split = analysis.prompt_split(records).set_index("tier")
    for tier, rows in records.groupby("tier", sort=False):
        print(f"tier {tier}: {len(rows)} requests, cached share "
              f"{split.at[tier, 'hit_share']:.3f}, median TTFT {rows.ttft_s.median():.3f} s "
              f"-> {out / tier}/records.jsonl")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    import logging

    from kvrepro.sweep import load_grid, run_sweep

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        points, point_fn, _ = load_grid(args.grid)
        table = run_sweep(points, args.out, point_fn=point_fn, address=args.address,
                          max_parallel=args.max_parallel, progress=not args.no_progress,
                          retry_failed=args.retry_failed)
    except (ValueError, FileNotFoundError, ImportError) as err:
        print(f"kvrepro sweep: {err}", file=sys.stderr)
        return 2
    stats = table.attrs
    print(f"{len(table)} points in {args.out}/sweep.parquet: ran {stats['ran']} "
          f"({stats['failed']} failed) in {stats['wall_s']:.1f} s, skipped {stats['skipped']} "
          "already finished")
    failed = table[table.status != "ok"]
    for _, row in failed.iterrows():
        print(f"FAILED point {row.point_id}: {row.error}", file=sys.stderr)
    return 1 if len(failed) else 0


def _add_sweep_parser(sub: argparse._SubParsersAction) -> None:
    sweep = sub.add_parser("sweep", help="run a grid of twin runs on Ray (resumable)")
    sweep.add_argument("grid", help="grid file, e.g. data/sweeps/whatif_48.yaml, or a "
                       "shipped grid's name (whatif_48)")
    sweep.add_argument("--out", required=True, help="sweep folder: points/, sweep.parquet; "
                       "an existing one is resumed (only missing points run); any other "
                       "folder that is not empty is refused")
    sweep.add_argument("--address", help="a Ray cluster (ray.init(address=...)); default: "
                       "a local Ray")
    sweep.add_argument("--max-parallel", type=_positive_int, metavar="N",
                       help="points at once (default: every CPU Ray has)")
    sweep.add_argument("--retry-failed", action="store_true",
                       help="run failed points of an existing folder again")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    sweep.set_defaults(func=_sweep)


def _print_fits(headlines: Any) -> None:
    """The residual of every fitted target (`kvrepro.studies.fits`): a broken fit shows."""
    from kvrepro.studies.fits import fitted_residuals

    fits = fitted_residuals(headlines)
    print(f"\nFitted targets: residual against the study ({int(fits['within'].sum())} of "
          f"{len(fits)} within tolerance, {int(fits['beyond_reach'].sum())} declared beyond "
          f"reach of the stated facts; refit with `kvrepro calibrate --plan PLAN`):\n")
    print(fits.round(2).to_string(index=False))


def _plan_for(server: str) -> Path:
    """The shipped calibration plan whose `server` is this server spec file."""
    from kvrepro._paths import data_dir
    from kvrepro.calibration.calibrate import load_plan, server_path

    wanted = Path(server).resolve()
    for plan in sorted((data_dir() / "studies").glob("*.yaml")):
        if server_path(plan, load_plan(plan)) == wanted:
            return plan
    raise SystemExit(f"kvrepro calibrate: no calibration plan in data/studies/ names the "
                     f"server {server!r}; pass --plan FILE")


def _calibrate(args: argparse.Namespace) -> int:
    from kvrepro.calibration.calibrate import calibrate, fit_table

    plan = Path(args.plan) if args.plan else _plan_for(args.server)
    result = calibrate(plan, args.out, max_parallel=args.max_parallel,
                       progress=not args.no_progress, write=not args.no_write)
    print(f"calibrated {plan} in {result.wall_s:.0f} s ({len(result.points)} twin campaigns, "
          f"{result.points_run} run now, the others read back):")
    for name, value in result.values.items():
        print(f"  {name} = {value}")
    table = fit_table(plan, result.residuals)
    print(table.round(2).to_string(index=False))
    print("written into the plan and its server spec" if not args.no_write
          else "nothing written (--no-write)")
    # a target the plan declares beyond reach (with why) may miss; any other miss fails
    return 0 if (table["within"] == ~table["beyond_reach"]).all() else 1


def _add_calibrate_parser(sub: argparse._SubParsersAction) -> None:
    cal = sub.add_parser("calibrate", help="fit a study's twin parameters to its fitted "
                         "targets (Ray sweep, resumable) and write them into the spec")
    which = cal.add_mutually_exclusive_group(required=True)
    which.add_argument("--plan", help="calibration plan, e.g. data/studies/study_a.yaml")
    which.add_argument("--server", help="a server spec; its plan is the one in data/studies/ "
                       "that names it")
    cal.add_argument("--out", help="sweep folders (default runs/calibrate/<plan>-<key>; "
                     "an existing one is resumed)")
    cal.add_argument("--max-parallel", type=_positive_int, metavar="N",
                     help="twin campaigns at once (default: every CPU Ray has)")
    cal.add_argument("--no-write", action="store_true", help="report the fit, change no file")
    cal.add_argument("--no-progress", action="store_true", help="no progress bar")
    cal.set_defaults(func=_calibrate)


def _predict(args: argparse.Namespace) -> int:
    from kvrepro.plots.external_figures import score
    from kvrepro.studies.external.case import load_case, resolve_case
    from kvrepro.studies.external.predict import predict_all, refit, tier_effects

    for case in args.cases:  # a bad case file stops here, before any folder is made
        load_case(resolve_case(case))
    if args.refit:
        print(f"refitted the twin's constants into {refit()}")
    out = _made_folder(Path(args.out) if args.out else _new_run_folder("predict"),
                       "predict folder")
    table = predict_all(out, args.cases or None, progress=not args.no_progress)
    table.to_csv(out / "external.csv", index=False)
    effects = tier_effects(table)
    effects.to_csv(out / "tier_effects.csv", index=False)
    shown = table[["case", "metric", "tier", "point", "published", "predicted", "error_pct",
                   "label"]]
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    s = score(table)
    print(f"predicted: {s['within_25']} of {s['n_predicted']} within 25 %, {s['within_10']} "
          f"within 10 %; {s['n_fitted']} fitted; tier effects right: "
          f"{int(effects['direction_right'].sum())} of {len(effects)}")
    print(f"written: {out / 'external.csv'}, {out / 'tier_effects.csv'}")
    return 0


def _add_predict_parser(sub: argparse._SubParsersAction) -> None:
    pred = sub.add_parser("predict", help="predict external GPU cases (published measurements "
                          "or your own case file) with the twin: predicted vs published")
    pred.add_argument("cases", nargs="*", metavar="CASE",
                      help="a shipped case name (data/external/) or a case file; none: all "
                           "shipped")
    pred.add_argument("--out", help="folder for external.csv and the twin's files (default "
                      "runs/predict-<UTC time>)")
    pred.add_argument("--refit", action="store_true", help="first refit the fitted constants "
                      "from their fit cases and rewrite data/external/constants.yaml")
    pred.add_argument("--no-progress", action="store_true", help="no progress bar")
    pred.set_defaults(func=_predict)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _seconds(text: str, allow_zero: bool) -> float:
    """A time flag's value: a finite number of seconds, > 0 (or >= 0 with `allow_zero`).
    Why: `--duration-s -5` ran nothing and exited 0; `--warmup-s -3` was taken as is."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds {'>=' if allow_zero else '>'} 0, got {text!r}")
    return value


def _positive_s(text: str) -> float:
    """argparse type: seconds > 0 (`_seconds`)."""
    return _seconds(text, allow_zero=False)


def _non_negative_s(text: str) -> float:
    """argparse type: seconds >= 0 (`_seconds`)."""
    return _seconds(text, allow_zero=True)


def _add_workload_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", default="agentic", help="agentic, micro or macro")
    parser.add_argument("--workload-dir", help="a saved workload folder instead of generating")
    parser.add_argument("-w", "--workload-param", action="append", default=[],
                        metavar="KEY=VALUE", help="workload spec parameter (repeatable)")
    parser.add_argument("--duration-s", type=_positive_s,
                        help="stop sending new turns after this")
    parser.add_argument("--warmup-s", type=_non_negative_s, default=0.0)
    parser.add_argument("--max-in-flight", type=_positive_int, default=None, metavar="N",
                        help="load client's concurrency limit (default: none; each session "
                             "has one request in flight at most)")


OVERRIDE_HELP = ("server spec override: a dotted path (twin.mfu=0.3, "
                 "tiers.dram.stores.0.eviction=ttl) or dram_gb / flash_gb / staging_gb "
                 "(repeatable)")


def _add_run_parser(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run a workload on an engine")
    engines = run.add_subparsers(dest="engine", required=True)
    live = engines.add_parser("live", help="deploy vLLM tiers (one after another) and drive them")
    live.add_argument("--server", "--tiers", dest="server", required=True,
                      help="server spec, e.g. data/servers/cpu_tiny.yaml")
    live.add_argument("--tier", action="append", help="tier name (repeatable; default: all)")
    live.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                      help=OVERRIDE_HELP)
    _add_workload_args(live)
    live.add_argument("--request-timeout-s", type=_positive_s, default=600.0)
    live.add_argument("--sample-interval-s", type=_positive_s, default=2.0)
    live.add_argument("--out", help="campaign folder (default: new runs/live-<UTC time>-<id>)")
    live.add_argument("--dry-run", action="store_true",
                      help="write and print every command line, environment and config file "
                           "of every tier into the run folder; start nothing")
    live.set_defaults(func=_run_live)
    sim = engines.add_parser("sim", help="simulate tiers (digital twin) on a workload")
    sim.add_argument("--server", "--profile", dest="server", required=True,
                     help="server spec, e.g. data/servers/study_a.yaml")
    sim.add_argument("--tier", action="append", help="tier name (repeatable; default: all)")
    sim.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                     help=OVERRIDE_HELP)
    sim.add_argument("--flash-profile", metavar="FILE",
                     help="measured flash tier (notebook 11 / kvrepro.storage.profile): its "
                          "bandwidths and per-chunk latencies replace those of the stores "
                          "named by --flash-store (after the -p overrides)")
    sim.add_argument("--flash-store", action="append", metavar="NAME",
                     help="offload store(s) that get --flash-profile (repeatable; "
                          "default: every store named 'flash')")
    _add_workload_args(sim)
    sim.add_argument("--out", help="campaign folder (default: new runs/sim-<UTC time>-<id>)")
    sim.set_defaults(func=_run_sim)
    _add_fleet_parser(engines)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (separate so tests and docs can inspect it)."""
    parser = _Parser(prog="kvrepro", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("reproduce", help="run every notebook, write figures and numbers")
    rep.add_argument("--only", action="append", metavar="NAME",
                     help="run only notebooks whose name contains NAME (repeatable)")
    rep.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                     help="override a notebook parameter (value parsed as YAML; repeatable)")
    rep.add_argument("--notebooks", default="notebooks", help="folder of NN_name.ipynb")
    rep.add_argument("--figures", default="figures", help="where figures are written")
    rep.add_argument("--runs", default="runs", help="where executed notebooks are written")
    rep.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                     help="notebooks run at once (default: one per CPU, at most 4; those "
                          "marked runs_alone, fio and the Ray sweeps, run by themselves)")
    rep.add_argument("--store-checked-outputs", action="store_true",
                     help="copy the outputs of '# NBVAL_CHECK_OUTPUT' cells back into the "
                          "notebooks (accept on purpose a change that moves a checked number)")
    rep.set_defaults(func=_reproduce)
    _add_run_parser(sub)
    _add_sweep_parser(sub)
    _add_calibrate_parser(sub)
    _add_doctor_parser(sub)
    _add_predict_parser(sub)
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its errors one line (`kvrepro run sim: error: argument --duration-s:
    ...`) like every other bad input; argparse's own prints the whole usage before it. The
    subcommands' parsers are of this class too (`add_subparsers` takes the parent's)."""

    def error(self, message: str) -> NoReturn:
        """Print `message` as one line and exit 2, as argparse does after its usage."""
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} "
                     f"(see {self.prog} --help)\n")


def _one_line(err: BaseException) -> str:
    """An expected error as one line naming its input: a pydantic error as `key: message`
    (no URL, no input dump), an OSError as `path: reason`."""
    from pydantic import ValidationError

    from kvrepro._checks import validation_problems

    if isinstance(err, ValidationError):
        text = f"invalid {err.title}: {validation_problems(err)}"
    elif isinstance(err, socket.gaierror):
        text = f"a host name does not resolve ({err.strerror}); check the spec's hosts"
    elif isinstance(err, OSError) and err.filename is not None and err.strerror:
        both = f"{err.filename} -> {err.filename2}" if err.filename2 else err.filename
        text = f"{both}: {err.strerror}"
    elif isinstance(err, OverflowError):
        text = f"{err} (a number of the input is too large or not finite)"
    else:
        text = str(err) or type(err).__name__
    return " ".join(text.split())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `kvrepro` console script. Every expected error (a bad spec, value
    or flag; a folder or file that cannot be written, RefusedFolder among them; a host that
    does not resolve) is one line on stderr naming the input, exit 2 (`_one_line`). Other
    exceptions are bugs of ours and keep their traceback."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (OSError, ValueError, OverflowError) as err:  # UnicodeDecodeError, pydantic's too
        command = " ".join(filter(None, (args.command, getattr(args, "engine", None))))
        print(f"kvrepro {command}: {_one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
