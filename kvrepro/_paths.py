"""Where the shipped data lives, in a source checkout and in an installed wheel."""

from __future__ import annotations

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
