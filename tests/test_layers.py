"""The package's layout: imports run one way, and no two modules import each other.

    apps (cli, reproduce, report) -> studies -> calibration -> engines (+ sweep)
      -> workload / calc / analysis / storage / plots -> specs (+ stores) -> helpers

An import may go down or stay in its layer; within a layer the packages import each other
without a cycle, and no module imports itself round a loop. An import under
`if TYPE_CHECKING:` does not run, so it is the one allowed exception. The layer table and
the walk are `kvrepro._layers`'s (scripts/import_edges.py prints the same graph).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvrepro._layers import (
    LAYERS,
    cycles,
    import_edges,
    modules,
    package_edges,
    unit,
    upward,
)

ROOT = Path(__file__).resolve().parents[1]


EDGES = import_edges(ROOT)


def test_no_import_goes_up_a_layer() -> None:
    assert EDGES, "no import edges found: the walk is broken"
    assert not upward(EDGES)


def test_no_two_modules_import_each_other() -> None:
    assert not cycles(EDGES)


def test_no_two_packages_of_a_layer_import_each_other() -> None:
    assert not cycles(package_edges(EDGES))


def test_every_module_is_in_a_layer() -> None:
    """A new module or subpackage is listed in `LAYERS` (none falls into `kvrepro`'s own)."""
    assert {unit(m)[1] for m in modules(ROOT)} <= {p for _, ps in LAYERS for p in ps}


def test_the_stores_are_specs_below_the_server_spec() -> None:
    """`kvrepro.stores` (one module per store kind) is in the specs layer; the server spec
    imports it and it never imports the server spec."""
    assert LAYERS[unit("kvrepro.stores.flash")[0]][0] == "specs"
    assert ("kvrepro.tier_spec", "kvrepro.stores") in package_edges(EDGES)
    assert not [(a, b) for a, b in EDGES
                if a.startswith("kvrepro.stores") and b == "kvrepro.tier_spec"]


def test_nothing_in_the_package_imports_the_layer_table() -> None:
    assert not [a for a, b in EDGES if b == "kvrepro._layers"]


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
    ({"__init__.py": "", "tier_spec.py": "from kvrepro.stores import flash\n",
      "stores/__init__.py": "", "stores/flash.py": "from kvrepro import tier_spec\n"},
     "package cycle"),
    ({"__init__.py": "", "tier_spec.py": "", "stores/__init__.py": "",
      "stores/flash.py": "from kvrepro import tier_spec\n"}, "stores import the spec"),
])
def test_the_guard_catches_what_it_guards(tmp_path: Path, files: dict[str, str],
                                          broken: str) -> None:
    edges = import_edges(_tree(tmp_path, files))
    found = {"upward": bool(upward(edges)), "cycle": bool(cycles(edges)),
             "package cycle": bool(cycles(package_edges(edges))),
             "stores import the spec": bool([(a, b) for a, b in edges
                                             if a.startswith("kvrepro.stores")
                                             and b == "kvrepro.tier_spec"])}
    assert found[broken], (broken, sorted(edges))


def test_a_module_in_no_layer_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"__init__.py": "", "newpkg/__init__.py": "",
                            "newpkg/m.py": "import kvrepro\n"})
    with pytest.raises(ValueError, match="kvrepro.newpkg.m is in no layer"):
        upward(import_edges(root))


def test_type_checking_imports_are_the_allowed_exception(tmp_path: Path) -> None:
    edges = import_edges(_tree(tmp_path, {
        "__init__.py": "", "engines/__init__.py": "", "studies/__init__.py": "",
        "studies/y.py": "",
        "engines/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                        "    from kvrepro.studies import y\n"}))
    assert not upward(edges)


def private_imports(root: Path) -> list[str]:
    """`from kvrepro.<module> import _name` where the module is not itself private
    (`kvrepro._checks` is the helpers' public face): a name one module keeps to itself,
    used by another."""
    import ast

    found = []
    for path in sorted((root / "kvrepro").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvrepro")
                    and not node.module.rsplit(".", 1)[-1].startswith("_")):
                folder = root.joinpath(*node.module.split("."))
                found += [f"{path.relative_to(root)}: {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_")
                          and not (folder / f"{a.name}.py").exists()]  # a helper module
    return found


def test_no_module_imports_another_ones_private_name() -> None:
    assert private_imports(ROOT) == []


def test_the_private_import_guard_sees_one(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"__init__.py": "", "a.py": "_x = 1\n",
                            "b.py": "from kvrepro.a import _x\n"})
    assert private_imports(root) == ["kvrepro/b.py: kvrepro.a._x"]
