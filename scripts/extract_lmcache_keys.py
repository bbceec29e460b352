"""Print LMCache's config key list for `kvrepro/engines/live/lmcache_keys.py`.

Reads `lmcache/v1/config.py` of an LMCache release without importing it (importing LMCache may
need torch and CUDA) and prints the module-level `_CONFIG_DEFINITIONS` as the `LMCACHE_KEYS`
dict (key -> (type, default), both as source text) and `_CONFIG_ALIASES` / `_DEPRECATED_CONFIGS`
as `LMCACHE_OLD_NAMES`. Usage:

    python scripts/extract_lmcache_keys.py .venv/lib/python3.11/site-packages/lmcache/v1/config.py
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _assignment(tree: ast.Module, name: str) -> ast.Dict:
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == name and isinstance(node.value, ast.Dict):
            return node.value
    raise SystemExit(f"no module-level dict {name} in the file")


def extract(path: Path) -> tuple[dict[str, tuple[str, str]], dict[str, str | None]]:
    """(key -> (type text, default text), old name -> new name or None)."""
    src = path.read_text()
    tree = ast.parse(src)
    keys = {}
    node = _assignment(tree, "_CONFIG_DEFINITIONS")
    for key, spec in zip(node.keys, node.values, strict=True):
        fields = {ast.literal_eval(k): ast.get_source_segment(src, v)
                  for k, v in zip(spec.keys, spec.values, strict=True)}
        keys[ast.literal_eval(key)] = (fields["type"], fields["default"])
    aliases = ast.literal_eval(_assignment(tree, "_CONFIG_ALIASES"))
    deprecated = ast.literal_eval(_assignment(tree, "_DEPRECATED_CONFIGS"))
    old = {**aliases, **{name: aliases.get(name) for name in deprecated}}
    return keys, old


def main() -> None:
    keys, old = extract(Path(sys.argv[1]))
    print("LMCACHE_KEYS: dict[str, tuple[str, str]] = {")
    for key, (type_text, default_text) in keys.items():
        print(f"    {key!r}: ({type_text!r}, {default_text!r}),".replace("'", '"', 4))
    print("}")
    print("LMCACHE_OLD_NAMES: dict[str, str | None] = {")
    for name, new in old.items():
        print(f'    "{name}": ' + (f'"{new}",' if new else "None,"))
    print("}")
    print(f"# {len(keys)} keys", file=sys.stderr)


if __name__ == "__main__":
    main()
