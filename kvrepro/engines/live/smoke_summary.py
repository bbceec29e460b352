"""The one-screen summary of `scripts/gpu_smoke.sh`: `python -m kvrepro.engines.live.smoke_summary
OUT` reads the smoke folder (the doctors' JSON, the dry run, the campaign's tier folders) and
prints what a person checks first: which doctor lines failed and why, and per tier the requests
served, the share of prompt tokens served from cache and the median TTFT.

`python -m kvrepro.engines.live.smoke_summary --pack TARBALL OUT` packs the folder into a new
tarball (never over an existing file) for a public issue: by default a copy in which this
machine's host name (in every file, and `host.hostname` of every run's meta.json), the home
folder, the repository, the virtual environment and the user name in paths are replaced by
placeholders; `--with-host-details` packs the files as they are. The folder itself is not
changed (what a run records locally stays whole)."""

from __future__ import annotations

import argparse
import getpass
import gzip
import io
import json
import os
import platform
import re
import socket
import sys
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvrepro import analysis
from kvrepro._files import own_file
from kvrepro._signals import stop_on_signals
from kvrepro.records import read_runs

HOST = "<host>"
SKIPPED = "lmcache-l2"  # a run's own flash folder: KV files, not a diagnosis


def doctor_lines(path: Path) -> list[str]:
    """`name: N passed, M failed` and one line per failed check."""
    if not path.is_file():
        return [f"{path.name}: not written (the doctor did not run)"]
    checks = json.loads(path.read_text())
    failed = [c for c in checks if not c["ok"]]
    lines = [f"{path.stem}: {len(checks) - len(failed)} passed, {len(failed)} failed"]
    lines += [f"  FAIL {' '.join(filter(None, (c['check'], c['subject'])))}: {c['why']}"
              for c in failed]
    return lines


def campaign_table(campaign: Path) -> pd.DataFrame:
    """Per tier: requests ok / failed, cached share of prompt tokens, median TTFT."""
    folders = sorted((p for p in campaign.iterdir() if (p / "meta.json").is_file()),
                     key=lambda p: json.loads((p / "meta.json").read_text()).get(
                         "started_utc", ""))  # in the order the tiers ran
    records, _ = read_runs(folders)
    split = analysis.prompt_split(records).set_index("tier")
    rows = []
    for tier, part in records.groupby("tier", sort=False):
        ok = part[part.error == ""]
        rows.append({"tier": tier, "requests_ok": len(ok), "failed": len(part) - len(ok),
                     "cached_share": round(float(split.at[tier, "hit_share"]), 3),
                     "median_ttft_s": round(float(ok.ttft_s.median()), 4)})
    return pd.DataFrame(rows)


def summary(out: Path) -> str:
    lines = [f"GPU smoke run {out}"]
    for name in ("doctor-smoke", "doctor-study"):
        lines += doctor_lines(out / f"{name}.json")
    dry = out / "dry-run" / "dry_run.txt"
    lines.append(f"dry run: {dry}" if dry.is_file() else "dry run: not written")
    campaign = out / "campaign"
    if campaign.is_dir() and any(campaign.iterdir()):
        lines += ["campaign:", campaign_table(campaign).to_string(index=False)]
    else:
        lines.append("campaign: not run")
    return "\n".join(lines)


@dataclass(frozen=True)
class Redactions:
    """What the packed copy replaces: (pattern, placeholder) pairs applied to every file's
    bytes in order, and whether each meta.json's `host.hostname` is replaced."""

    pairs: tuple[tuple[re.Pattern[bytes], bytes], ...] = ()
    meta_host: bool = False

    @classmethod
    def here(cls, repo: Path, venv: Path | None) -> Redactions:
        """This machine's: its host names (a whole word; a short name such as `vm` is
        replaced wherever it stands alone, e.g. `/proc/sys/<host>`, rather than leaked), the
        venv, the repository and the home folder (longest first: `<venv>/bin/python`), and
        the user name as a path segment (`/scratch/<user>/`; not `root`)."""
        places = {"<venv>": venv, "<repo>": repo, "~": Path.home()}
        paths = sorted({(str(p), name) for name, path in places.items() if path is not None
                        for p in (path.absolute(), path.resolve()) if p != p.parent},
                       key=lambda item: -len(item[0]))
        pairs = [(re.compile(re.escape(text.encode()) + rb"(?![\w.-])"), name.encode())
                 for text, name in paths]
        for host in sorted(_host_names(), key=len, reverse=True):
            pairs.append((re.compile(rb"(?<![\w.-])" + re.escape(host.encode()) + rb"(?![\w-])"),
                          HOST.encode()))
        user = getpass.getuser()
        if user != "root":
            pairs.append((re.compile(rb"(?<=/)" + re.escape(user.encode()) + rb"(?![\w.-])"),
                          b"<user>"))
        return cls(tuple(pairs), meta_host=True)

    def apply(self, path: Path, data: bytes) -> bytes:
        """`data` (the file at `path`) with every redaction made; a gzip file's content
        (a compressed server log) is redacted inside and compressed again."""
        if path.suffix == ".gz":
            try:
                inner = gzip.decompress(data)
            except (OSError, EOFError, zlib.error):
                inner = None  # not gzip after all: redacted as it is
            if inner is not None:
                return gzip.compress(self.apply(path.with_suffix(""), inner), mtime=0)
        if self.meta_host and path.name == "meta.json":
            data = _without_hostname(data)
        for pattern, placeholder in self.pairs:
            data = pattern.sub(placeholder, data)
        return data


def _host_names() -> set[str]:
    """This machine's names as files may hold them: full and first label."""
    names = {socket.gethostname(), platform.node()}
    return {n for name in names if name for n in (name, name.split(".")[0])}


def _without_hostname(data: bytes) -> bytes:
    """A run's meta.json with `host.hostname` replaced (`kvrepro.records.host_info`), so the
    name is gone even where the text pass would miss it."""
    try:
        meta = json.loads(data)
    except ValueError:
        return data
    if isinstance(meta, dict) and isinstance(meta.get("host"), dict) and "hostname" in meta["host"]:
        meta["host"]["hostname"] = HOST
        return (json.dumps(meta, indent=2) + "\n").encode()
    return data


def _members(out: Path) -> list[Path]:
    """The folders and regular files under `out` (symlinks not followed or packed, a run's
    flash folder left out), parents first."""
    found = []
    for folder, dirs, files in os.walk(out):
        dirs[:] = sorted(d for d in dirs if d != SKIPPED and not Path(folder, d).is_symlink())
        found += [Path(folder, d) for d in dirs]
        found += [Path(folder, f) for f in sorted(files) if Path(folder, f).is_file()
                  and not Path(folder, f).is_symlink()]
    return found


def _write_tar(out: Path, fileobj: io.BufferedWriter, redactions: Redactions | None) -> None:
    """A gzip tar of `out` under its own name; owners left out when redacting."""
    with tarfile.open(fileobj=fileobj, mode="w:gz") as tar:
        for path in [out, *_members(out)]:
            info = tar.gettarinfo(str(path), arcname=str(Path(out.name, path.relative_to(out))))
            if redactions is not None:
                info.uname = info.gname = ""
                info.uid = info.gid = 0
            if not path.is_file():
                tar.addfile(info)
                continue
            data = path.read_bytes()
            data = redactions.apply(path, data) if redactions is not None else data
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def pack(out: Path, tarball: Path, redactions: Redactions | None) -> None:
    """Write `tarball` (a new file: FileExistsError if anything has that name, even after a
    race) from `out`, redacted unless `redactions` is None. Written into a file of our own
    beside it, then linked to its name (which never replaces), so no half tarball shows."""
    tarball = tarball.absolute()
    with own_file(tarball.parent, f".{tarball.name}.") as (temp, fd):
        with os.fdopen(os.dup(fd), "wb") as stream:
            _write_tar(out, stream, redactions)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temp, 0o644)
        os.link(temp, tarball)


def main(argv: list[str] | None = None) -> int:
    """The summary on stdout, or (--pack) the tarball; exit 2 with one line when the
    tarball cannot be written."""
    parser = argparse.ArgumentParser(prog="python -m kvrepro.engines.live.smoke_summary",
                                     description="the smoke folder's summary, or its tarball")
    parser.add_argument("out", type=Path, help="the smoke folder")
    parser.add_argument("--pack", type=Path, metavar="TARBALL", help="write a new tarball")
    parser.add_argument("--with-host-details", action="store_true",
                        help="pack host names and paths as they are")
    args = parser.parse_args(argv)
    if args.pack is None:
        print(summary(args.out))
        return 0
    venv = Path(sys.prefix) if sys.prefix != sys.base_prefix else None
    redactions = None if args.with_host_details else Redactions.here(Path.cwd(), venv)
    try:
        with stop_on_signals():  # SIGTERM too removes the half-written temporary tarball
            pack(args.out, args.pack, redactions)
    except FileExistsError:
        print(f"{args.pack} exists: not overwritten; set OUT to a new name", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"{args.pack}: cannot write it: {err.strerror or err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
