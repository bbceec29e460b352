"""Print the package-level import edges of kvrepro, each with its layers, and what breaks them.

    .venv/bin/python scripts/import_edges.py

The walk and the layer table are `kvrepro._layers`'s, the ones tests/test_layers.py checks
(one definition): every import of every module, those inside functions included and those
under TYPE_CHECKING left out, folded onto the packages of `LAYERS`. An edge marked UP goes up
a layer; the last lines list module and package cycles (none is allowed).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's kvrepro, installed or not

from kvrepro._layers import LAYERS, cycles, import_edges, unit, upward  # noqa: E402


def main() -> int:
    edges = import_edges(ROOT)
    folded = Counter((unit(a), unit(b)) for a, b in edges if unit(a)[1] != unit(b)[1])
    print(f"{len(edges)} module import edges, {len(folded)} between packages:")
    for ((ra, a), (rb, b)), n in sorted(folded.items()):
        mark = "UP" if rb < ra else ("same layer" if ra == rb else "down")
        print(f"  {a:24s} -> {b:24s} {n:3d}  {LAYERS[ra][0]} -> {LAYERS[rb][0]}  {mark}")
    bad, loops = upward(edges), cycles(edges)
    packages = cycles({(a[1], b[1]) for (a, b) in folded})
    print(f"upward edges: {len(bad)}", *bad, sep="\n  ")
    print(f"module cycles: {len(loops)}", *loops, sep="\n  ")
    print(f"package cycles: {len(packages)}", *packages, sep="\n  ")
    return 1 if bad or loops or packages else 0


if __name__ == "__main__":
    raise SystemExit(main())
