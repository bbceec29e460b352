"""The package's layout: imports run one way, and no two modules import each other.

    apps (cli, reproduce, report) -> studies -> calibration -> engines (+ sweep)
      -> workload / calc / analysis / storage / plots -> specs -> helpers

An import may go down or stay in its layer; within a layer the packages import each other
without a cycle, and no module imports itself round a loop. An import under
`if TYPE_CHECKING:` does not run, so it is the one allowed exception.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("apps", ("kvrepro.cli", "kvrepro.reproduce", "kvrepro.report")),
    ("studies", ("kvrepro.studies",)),
    ("calibration", ("kvrepro.calibration",)),
    ("engines", ("kvrepro.engines", "kvrepro.sweep")),
    ("stages", ("kvrepro.workload", "kvrepro.calc", "kvrepro.analysis", "kvrepro.storage",
                "kvrepro.plots")),
    ("specs", ("kvrepro.tier_spec", "kvrepro.fleet_spec", "kvrepro.model_spec",
               "kvrepro.records")),
    ("helpers", ("kvrepro._checks", "kvrepro._paths", "kvrepro._lines", "kvrepro._locks",
                 "kvrepro._signals", "kvrepro._files", "kvrepro")),
)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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
    files = sorted((root / "kvrepro").rglob("*.py"))
    modules = {_module_name(f, root) for f in files}
    edges = set()
    for path in files:
        module, tree = _module_name(path, root), ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            for name in _targets(node, module, path.name == "__init__.py"):
                while name not in modules and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name in modules and name != module and name.startswith("kvrepro"):
                    edges.add((module, name))
    return edges


def _unit(module: str) -> tuple[int, str]:
    """(layer index, top package) of a module: the longest listed prefix wins."""
    best = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > len(best[1]):
                    best = (rank, prefix)
    if best is None:
        raise AssertionError(f"module {module} is in no layer of tests/test_layers.py")
    return best


def upward(edges: set[tuple[str, str]]) -> list[str]:
    """Imports that go up a layer."""
    bad = []
    for src, dst in sorted(edges):
        (rank_src, _), (rank_dst, _) = _unit(src), _unit(dst)
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


def _package_edges(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The same edges between the layers' packages (kvrepro.calc, kvrepro.analysis, ...)."""
    units = {(_unit(a)[1], _unit(b)[1]) for a, b in edges}
    return {(a, b) for a, b in units if a != b}


EDGES = import_edges(ROOT)


def test_no_import_goes_up_a_layer() -> None:
    assert EDGES, "no import edges found: the walk is broken"
    assert not upward(EDGES)


def test_no_two_modules_import_each_other() -> None:
    assert not cycles(EDGES)


def test_no_two_packages_of_a_layer_import_each_other() -> None:
    assert not cycles(_package_edges(EDGES))


@pytest.mark.parametrize("engine,other", [("sim", "live"), ("live", "sim")])
def test_neither_engine_imports_the_other(engine: str, other: str) -> None:
    bad = sorted((a, b) for a, b in EDGES if a.startswith(f"kvrepro.engines.{engine}")
                 and b.startswith(f"kvrepro.engines.{other}"))
    assert not bad


# ------------------------------------------------------------------ the guard, broken on purpose


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "kvrepro" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize("files, broken", [
    ({"__init__.py": "", "engines/__init__.py": "", "studies/__init__.py": "",
      "engines/x.py": "from kvrepro.studies import y\n", "studies/y.py": ""}, "upward"),
    ({"__init__.py": "", "engines/__init__.py": "",
      "engines/a.py": "def f():\n    from kvrepro.engines import b\n",
      "engines/b.py": "import kvrepro.engines.a\n"}, "cycle"),
    ({"__init__.py": "", "calc/__init__.py": "", "analysis/__init__.py": "",
      "calc/e.py": "from kvrepro import analysis\n",
      "analysis/r.py": "from kvrepro.calc import e as _e\n"}, "package cycle"),
])
def test_the_guard_catches_what_it_guards(tmp_path: Path, files: dict[str, str],
                                          broken: str) -> None:
    edges = import_edges(_tree(tmp_path, files))
    found = {"upward": bool(upward(edges)), "cycle": bool(cycles(edges)),
             "package cycle": bool(cycles(_package_edges(edges)))}
    assert found[broken], (broken, sorted(edges))


def test_type_checking_imports_are_the_allowed_exception(tmp_path: Path) -> None:
    edges = import_edges(_tree(tmp_path, {
        "__init__.py": "", "engines/__init__.py": "", "studies/__init__.py": "",
        "studies/y.py": "",
        "engines/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                        "    from kvrepro.studies import y\n"}))
    assert not upward(edges)
