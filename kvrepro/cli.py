"""Command line: `kvrepro reproduce [--only NAME] [-p key=value]`."""

from __future__ import annotations

import argparse
import sys

from kvrepro import reference


def _reproduce(args: argparse.Namespace) -> int:
    from kvrepro.reproduce import parse_overrides, reproduce

    try:
        overrides = parse_overrides(args.param)
        result = reproduce(args.notebooks, args.figures, args.runs, args.only, overrides)
    except (ValueError, FileNotFoundError) as err:
        print(f"kvrepro reproduce: {err}", file=sys.stderr)
        return 2
    print(f"\nExecuted notebooks: {result.run_dir}/")
    print(f"Figures: {args.figures}/")
    print("\nHeadline numbers, reproduced vs the studies' values "
          f"({result.run_dir / 'headline_numbers.csv'}):\n")
    print(reference.format_headlines(result.headlines))
    for failure in result.failures:
        print(f"\nFAILED: {failure}", file=sys.stderr)
    return 1 if result.failures else 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (separate so tests and docs can inspect it)."""
    parser = argparse.ArgumentParser(prog="kvrepro", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("reproduce", help="run every notebook, write figures and numbers")
    rep.add_argument("--only", action="append", metavar="NAME",
                     help="run only notebooks whose name contains NAME (repeatable)")
    rep.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                     help="override a notebook parameter (value parsed as YAML; repeatable)")
    rep.add_argument("--notebooks", default="notebooks", help="folder of NN_name.ipynb")
    rep.add_argument("--figures", default="figures", help="where figures are written")
    rep.add_argument("--runs", default="runs", help="where executed notebooks are written")
    rep.set_defaults(func=_reproduce)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `kvrepro` console script."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
