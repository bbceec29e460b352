"""Where the shipped data lives, in a source checkout and in an installed wheel."""

from __future__ import annotations

import re
from pathlib import Path


def data_dir() -> Path:
    """The shipped data folder: `data/` in a checkout, `kvrepro/_data` in a wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_data", here.parent / "data"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"kvrepro data folder not found next to {here}")


def data_file(*parts: str) -> Path:
    """Return a path inside the shipped data folder, failing clearly if it is missing."""
    path = data_dir().joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"shipped data file missing: {path}")
    return path


class RefusedFolder(FileExistsError):
    """A folder a run or sweep will not write into (it holds another run, another writer
    holds its lock, or it is not this user's); the CLI prints it as one line."""


SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
"""What a name that becomes a file or folder name (a tier, a fleet, a sweep point) must be."""


def safe_name(name: str, what: str) -> str:
    """`name` itself, if it can be a single path component; else ValueError naming `what`.
    Why: a tier called `../../x` would otherwise write its run outside the output folder."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"{what} {name!r} cannot name a folder: use letters, digits, '_', "
                         "'.' and '-', starting with a letter or digit")
    return name


def child_path(parent: str | Path, name: str, what: str) -> Path:
    """`parent / name` for a checked `name`, proven to resolve inside `parent` (a symlink
    named like the child that points elsewhere is refused too)."""
    parent = Path(parent)
    child = parent / safe_name(name, what)
    if not child.resolve().is_relative_to(parent.resolve()):
        raise ValueError(f"{what} {name!r}: {child} resolves outside {parent}")
    return child


def empty_folder(path: str | Path, what: str) -> Path:
    """`path`, made if missing; RefusedFolder when it already holds anything, so that what
    is written there (a dry run's files) never replaces another run's."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if any(path.iterdir()):
        raise RefusedFolder(f"{path}: not empty; a {what} writes only into a new or empty folder")
    return path
