"""The package's layers and its import graph, read from the source (standard library only).

    apps (cli, reproduce, report) -> studies -> calibration -> engines (+ sweep)
      -> workload / calc / analysis / storage / plots -> specs (+ stores) -> helpers

An import may go down or stay in its layer; within a layer the packages import each other
without a cycle, and no module imports itself round a loop. An import under
`if TYPE_CHECKING:` does not run, so it is the one allowed exception.

One definition for the two that check the layout: tests/test_layers.py (which fails on an
import against it) and scripts/import_edges.py (which prints every package edge). A helper of
those, not of the pipeline: no module of the package imports it at run time (a test checks).
"""

from __future__ import annotations

import ast
from pathlib import Path

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("apps", ("kvrepro.cli", "kvrepro.reproduce", "kvrepro.report")),
    ("studies", ("kvrepro.studies",)),
    ("calibration", ("kvrepro.calibration",)),
    ("engines", ("kvrepro.engines", "kvrepro.sweep")),
    ("stages", ("kvrepro.workload", "kvrepro.calc", "kvrepro.analysis", "kvrepro.storage",
                "kvrepro.plots")),
    ("specs", ("kvrepro.tier_spec", "kvrepro.fleet_spec", "kvrepro.model_spec",
               "kvrepro.records", "kvrepro.stores")),
    ("helpers", ("kvrepro._checks", "kvrepro._paths", "kvrepro._lines", "kvrepro._locks",
                 "kvrepro._signals", "kvrepro._files", "kvrepro._layers", "kvrepro")),
)
"""Each layer, top first, with the modules and packages in it (a package: all its modules).
`kvrepro` stands for the package's own `__init__` only, so a new module or subpackage is in
no layer until it is listed here (`unit` refuses it)."""
ROOT_PACKAGE = "kvrepro"


def module_name(path: Path, root: Path) -> str:
    """The dotted module name of a source file under `root`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> set[str]:
    """Every module under `root`/kvrepro."""
    return {module_name(f, root) for f in (root / ROOT_PACKAGE).rglob("*.py")}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return inside


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def import_edges(root: Path) -> set[tuple[str, str]]:
    """(importer, imported) between the modules under `root`/kvrepro, imports inside
    functions included, those under TYPE_CHECKING left out."""
    files = sorted((root / ROOT_PACKAGE).rglob("*.py"))
    names = {module_name(f, root) for f in files}
    edges = set()
    for path in files:
        module, tree = module_name(path, root), ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            for name in _targets(node, module, path.name == "__init__.py"):
                while name not in names and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name in names and name != module and name.startswith(ROOT_PACKAGE):
                    edges.add((module, name))
    return edges


def unit(module: str) -> tuple[int, str]:
    """(layer index, listed package) of a module: the longest listed prefix wins; a module
    in no layer is a ValueError."""
    best = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = prefix != ROOT_PACKAGE and module.startswith(prefix + ".")
            if (module == prefix or inside) and (best is None or len(prefix) > len(best[1])):
                best = (rank, prefix)
    if best is None:
        raise ValueError(f"module {module} is in no layer of kvrepro/_layers.py's LAYERS")
    return best


def upward(edges: set[tuple[str, str]]) -> list[str]:
    """Imports that go up a layer."""
    bad = []
    for src, dst in sorted(edges):
        (rank_src, _), (rank_dst, _) = unit(src), unit(dst)
        if rank_dst < rank_src:
            bad.append(f"{src} -> {dst} ({LAYERS[rank_src][0]} imports {LAYERS[rank_dst][0]})")
    return bad


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Every strongly connected group of more than one node (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)
        graph.setdefault(dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def package_edges(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The same edges between the layers' listed packages (kvrepro.calc, kvrepro.analysis,
    ...), an edge inside one package left out."""
    units = {(unit(a)[1], unit(b)[1]) for a, b in edges}
    return {(a, b) for a, b in units if a != b}


__all__ = ["LAYERS", "ROOT_PACKAGE", "cycles", "import_edges", "module_name", "modules",
           "package_edges", "unit", "upward"]
