"""Argument checks whose errors name the parameter (or the frame and its missing columns), so
a bad input is easy to find."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from numbers import Real
from typing import Any

import yaml


def positive(**values: float) -> None:
    """Raise ValueError naming the first parameter that is not a finite number > 0."""
    for name, value in values.items():
        if not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"parameter {name!r} must be a finite number > 0, got {value!r}")


def non_negative(**values: float) -> None:
    """Raise ValueError naming the first parameter that is not a finite number >= 0."""
    for name, value in values.items():
        if not isinstance(value, Real) or not math.isfinite(value) or value < 0:
            raise ValueError(f"parameter {name!r} must be a finite number >= 0, got {value!r}")


def require_columns(df: Any, columns: Iterable[str], what: str) -> None:
    """Raise ValueError "`what`: data lacks column(s) [...]" naming every missing column.

    `df` is a DataFrame (or anything with `.columns`); checking first fails early with the
    caller's name (a function, a figure, a file) instead of a KeyError deep inside pandas.
    """
    present = set(df.columns)
    missing = [c for c in columns if c not in present]
    if missing:
        raise ValueError(f"{what}: data lacks column(s) {missing}")


def not_utf8(err: UnicodeDecodeError) -> tuple[int, str]:
    """(1-based line, reason) for bytes that are not UTF-8, from the decoding error.

    Readers decode what they read themselves and report this like any malformed line, so a
    stray byte is a skipped line or an error naming file and line, never a bare
    UnicodeDecodeError. The line is counted in the bytes that were decoded (1 for a line
    decoded on its own).
    """
    data = bytes(err.object)
    line = data.count(b"\n", 0, err.start) + 1
    column = err.start - data.rfind(b"\n", 0, err.start)
    return line, f"not UTF-8 text (byte 0x{data[err.start]:02x} at column {column}: {err.reason})"


UNDECODABLE_RE = re.compile("[\udc80-\udcff]")
"""What a byte that is not UTF-8 becomes in text decoded with errors="surrogateescape" (how
a lax reader of a whole document finds which part of it held the byte)."""


def key_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a dotted key path, without union branch names."""
    parts = [str(p) for p in loc if not (isinstance(p, str) and "[" in p)]
    return ".".join(parts) or "(top level)"


def input_loc(loc: tuple[Any, ...], raw: Any) -> tuple[Any, ...]:
    """`loc` as keys of the input `raw`: the tags pydantic adds inside it for a union member
    (a store's `tiers.dram.stores.0.dram.capacity_bytes`, where the second `dram` is the
    store's kind) are left out, as they are no key the user wrote. A key missing from the
    input (a required field) is kept when it is the last."""
    node, kept = raw, []
    for depth, key in enumerate(loc):
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
        elif depth < len(loc) - 1 and isinstance(node, dict):
            continue  # a union tag: not in the input
        else:
            node = None
        kept.append(key)
    return tuple(kept)


def validation_problems(err: Any, prefix: str = "", raw: Any = None) -> str:
    """A pydantic ValidationError as one line, "<prefix>a.b: message; ..." for each bad key
    (with `raw`, the input, as its keys: `input_loc`). Why: str(err) spans lines, repeats
    the input and ends in a documentation URL; a user needs the key and what is wrong."""
    return "; ".join(
        f"{prefix}{key_path(e['loc'] if raw is None else input_loc(e['loc'], raw))}: "
        f"{' '.join(e['msg'].split())}" for e in err.errors())


def validate_model(raw: Any, model: Any, what: str, source: str) -> Any:
    """`raw` (parsed YAML, or a dict built in code) as pydantic `model`; an error names
    `source` and each bad key's dotted path ("<source>: invalid <what>: key a.b: ...")."""
    from pydantic import ValidationError

    if not isinstance(raw, dict):
        raise ValueError(f"{source}: expected a mapping at the top level")
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        problems = validation_problems(err, "key ", raw)
        raise ValueError(f"{source}: invalid {what}: {problems}") from err


class NoAliasLoader(yaml.SafeLoader):
    """`yaml.safe_load`'s loader that refuses aliases (`*name`), with the line of the first.

    Why: each alias repeats its anchor's whole node, so a chain of them ("billion laughs")
    makes a 466-byte file expand to 10 million values in memory. No config the package
    reads needs them; anchors alone (`&name`) repeat nothing and are read as before.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        """Refuse an alias where safe_load would insert the anchored node again."""
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"found alias *{event.anchor}: YAML aliases are refused (a few "
                "hundred bytes of them can expand to millions of values); write the value "
                "out", event.start_mark)
        return super().compose_node(parent, index)


def load_yaml(text: str, source: str) -> Any:
    """`yaml.safe_load(text)` without aliases (`NoAliasLoader`); malformed YAML or an alias
    is a ValueError naming `source` (a file name) and the line."""
    loader = NoAliasLoader(text)
    loader.name = source  # what each error mark names instead of "<unicode string>"
    try:
        return loader.get_single_data()
    except yaml.YAMLError as err:
        raise ValueError(f"{source}: malformed YAML: {err}") from err
    finally:
        loader.dispose()


def load_yaml_model(path: Any, model: Any, what: str) -> Any:
    """Read YAML file `path` into pydantic `model`; every error names the file, and each bad
    key its dotted path (`validate_model`). Why one function: every config the package
    reads (server specs, fleets, sweep grids) must fail the same clear way."""
    from pathlib import Path

    src = Path(path)
    if not src.is_file():
        raise FileNotFoundError(f"{what} not found: {src}")
    try:
        text = src.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        line, reason = not_utf8(err)
        raise ValueError(f"{src}: line {line}: {what} is {reason}") from err
    return validate_model(load_yaml(text, str(src)), model, what, str(src))
