"""What one optional package costs every process that imports jsonschema: vLLM's three
processes, each Ray worker, papermill and nbval (the Makefile removes it: SLOW_UNUSED).

Usage: .venv/bin/python benchmarks/bench_import_time.py [--repeats 5] [--cpu 0]

rfc3987-syntax (jsonschema's optional `iri` format checker) compiles its grammars when
imported, and jsonschema imports it when it is installed. For each module below, a fresh
interpreter imports it with rfc3987-syntax importable ("with") and with it blocked
(`sys.modules["rfc3987_syntax"] = None`, "without": jsonschema then skips that one format), the
two side by side in each round, pinned to one CPU like vLLM's engine. Prints the median wall
and user+sys CPU seconds of each. Where the package is not installed, both columns measure
"without".
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

MODULES = ["jsonschema", "ray", "nbformat", "vllm.v1.engine.core"]
BLOCK = "import sys; sys.modules['rfc3987_syntax'] = None; "


def timed_import(module: str, blocked: bool, cpu: int) -> tuple[float, float]:
    """(wall s, user+sys CPU s) of a fresh interpreter importing `module`."""
    code = (BLOCK if blocked else "") + f"import {module}"
    before, start = os.times(), time.perf_counter()
    subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-c", code], check=True)
    wall_s, after = time.perf_counter() - start, os.times()
    cpu_s = (after.children_user - before.children_user
             + after.children_system - before.children_system)
    return wall_s, cpu_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cpu", type=int, default=0)
    args = parser.parse_args()
    print(f"{'module':22} {'with: wall s':>13} {'cpu s':>7} {'without: wall s':>16} {'cpu s':>7}")
    for module in MODULES:
        runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.repeats):
            for blocked in (False, True):
                runs[blocked].append(timed_import(module, blocked, args.cpu))
        (wall, cpu), (wall_off, cpu_off) = (
            [statistics.median(run[i] for run in runs[blocked]) for i in (0, 1)]
            for blocked in (False, True))
        print(f"{module:22} {wall:13.2f} {cpu:7.2f} {wall_off:16.2f} {cpu_off:7.2f}")


if __name__ == "__main__":
    main()
