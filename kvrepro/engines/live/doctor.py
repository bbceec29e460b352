"""`kvrepro doctor`: check a server before a campaign, not 90 minutes into it.

Every check a live campaign would otherwise fail on late, each one line with pass / fail and
why: the GPUs (their count against tensor parallelism, their memory against the weights plus
the engine's KV budget) or, for a CPU server, the CPUs of its placement; host DRAM against
the stores that take it (each store's bill says how much, `StoreBase.bill`; and, on CPUs,
the engine's memory); each store folder of a tier (`TierSpec.folders`): a flash store's
(exists or can be made, free space against its capacity, its filesystem, one chunk written
and read back with O_DIRECT) and a shared filesystem's (exists or can be made and is
writable, free space, its filesystem, named `shared`); fio; the server's port; the installed
vllm / lmcache / vllm-router against the pins (`kvrepro.engines.live.pins`); the model. It
starts no server and leaves nothing behind: the probe file (`kvrepro._files.own_file`:
O_EXCL | O_NOFOLLOW, written and read only through its descriptor, never reopened by name)
and any folder it makes are its own, and removed on every way out (SIGTERM and SIGINT too,
under the CLI's `stop_on_signals`). A store folder is judged by the run's own rules
(`ownership.DiskFolder.check`), so the doctor and a run never disagree.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import shutil
import socket
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from kvrepro._files import own_file
from kvrepro.engines.live.ownership import (
    FolderRefused,
    flash_path,
    store_folder_owner,
)
from kvrepro.engines.live.pins import VLLM_DISTRIBUTION, installed_version, pinned_packages
from kvrepro.engines.live.processes import port_in_use
from kvrepro.stores import RUN_DIR, StoreBase, StoreFolder
from kvrepro.tier_spec import TINY_MODEL, ServerSpec, parse_cpu_list

VLLM_DEFAULT_GPU_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default
IN_MEMORY_FILESYSTEMS = {"tmpfs", "ramfs", "devtmpfs"}
PSEUDO_FILESYSTEMS = {"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs",
                      "tracefs", "securityfs", "configfs", "pstore", "bpf", "mqueue",
                      "hugetlbfs", "fusectl", "binfmt_misc", "efivarfs", "autofs", "nsfs",
                      "rpc_pipefs"}
"""Kernel views, not storage: a flash tier there stores nothing (or the kernel's settings)."""
ALIGN_BYTES = 4096  # O_DIRECT needs block-aligned buffers, offsets and sizes
PROBE_CAP_BYTES = 64 * 2**20
"""The O_DIRECT probe writes one chunk, but at most this much: a chunk of a million tokens
is gigabytes, which the check does not need and the disk and RAM may not spare."""
PIECE_BYTES = 2**20  # written, read back and compared this much at a time (RAM: two pieces)
GB = 1e9


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    check: str
    subject: str  # the tier or store it is about, "" for the server
    ok: bool
    why: str


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_total_bytes: float


# --------------------------------------------------------------------------- GPUs and CPUs


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """GPUs from `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits`
    (memory in MiB); ValueError naming the line that is not of that shape."""
    gpus = []
    for number, line in enumerate(text.strip().splitlines(), 1):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            raise ValueError(f"nvidia-smi output line {number}: {line!r} is not "
                             "'index, name, memory.total'")
        gpus.append(Gpu(int(parts[0]), parts[1], float(parts[2]) * 2**20))
    return gpus


def find_gpus() -> tuple[list[Gpu], str]:
    """The NVIDIA GPUs nvidia-smi lists, and why there are none when there are none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "nvidia-smi not found (no NVIDIA driver on PATH)"
    try:
        out = subprocess.run([smi, "--query-gpu=index,name,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
        return parse_nvidia_smi(out), "nvidia-smi lists no GPU"
    except (subprocess.SubprocessError, OSError, ValueError) as err:
        return [], f"nvidia-smi failed: {err}"


def _weights_and_kv_bytes(spec: ServerSpec, tiers: list[str]) -> tuple[float, float]:
    return spec.model_spec().weight_bytes, max(spec.kv_cache_bytes(t) for t in tiers)


def gpu_checks(spec: ServerSpec, tiers: list[str], gpus: list[Gpu], none_why: str
               ) -> list[Check]:
    """GPU count against tensor parallelism; each used GPU's memory against its share of the
    weights and of the largest engine KV budget, at the spec's (or vLLM's default) utilisation."""
    tp = spec.live.tensor_parallel_size
    names = ", ".join(f"{g.index}: {g.name} {g.memory_total_bytes / GB:.1f} GB" for g in gpus)
    count = Check("GPUs", "", len(gpus) >= tp,
                  f"{len(gpus)} found ({names or none_why}); tensor_parallel_size {tp} needs {tp}")
    weights, kv = _weights_and_kv_bytes(spec, tiers)
    need = (weights + kv) / tp
    util = spec.live.gpu_memory_utilization or VLLM_DEFAULT_GPU_UTILIZATION
    used = sorted(gpus, key=lambda g: g.index)[:tp]
    smallest = min((g.memory_total_bytes for g in used), default=0.0)
    memory = Check("GPU memory", "", len(used) == tp and need <= smallest * util,
                   f"each of {tp} GPUs needs {need / GB:.3g} GB (weights {weights / GB:.3g} GB "
                   f"+ KV {kv / GB:.3g} GB, / TP {tp}); "
                   + (f"smallest has {smallest / GB:.1f} GB x {util:g} = "
                      f"{smallest * util / GB:.1f} GB" if used else "no GPU to hold it"))
    return [count, memory]


def cpu_check(spec: ServerSpec) -> Check:
    """A CPU server: every CPU its placement names must be one this process may run on."""
    allowed = os.sched_getaffinity(0)
    named = {role: parse_cpu_list(text) for role, text in spec.placement.model_dump().items()
             if isinstance(text, str)}
    missing = {role: sorted(cpus - allowed) for role, cpus in named.items() if cpus - allowed}
    return Check("CPUs", "", not missing,
                 f"placement {', '.join(f'{r} {sorted(c)}' for r, c in named.items()) or 'none'}"
                 f" of allowed {sorted(allowed)}"
                 + (f"; not allowed: {missing}" if missing else ""))


# --------------------------------------------------------------------------- host memory


def dram_checks(spec: ServerSpec, tiers: list[str], available_bytes: float) -> list[Check]:
    """Host DRAM available against each tier's stores that take it (L1, staging: the host
    DRAM of their bill; LMCache allocates them at start) and, on a CPU server, the engine's
    weights and KV budget too."""
    checks = []
    for name in tiers:
        need = sum(s.bill().dram_bytes for s in spec.tier(name).stores)
        parts = [f"DRAM stores {need / GB:.2f} GB"]
        if spec.live.device == "cpu":
            weights, kv = spec.model_spec().weight_bytes, spec.kv_cache_bytes(name)
            need += weights + kv
            parts.append(f"engine weights {weights / GB:.2f} GB + KV {kv / GB:.2f} GB")
        if need == 0:
            continue
        checks.append(Check("host DRAM", name, need <= available_bytes,
                            f"needs {need / GB:.2f} GB ({' + '.join(parts)}); "
                            f"{available_bytes / GB:.2f} GB available"))
    return checks


# --------------------------------------------------------------------------- flash folders


def _existing_ancestor(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


@contextlib.contextmanager
def made_folder(path: Path) -> Iterator[Path]:
    """`path` as a folder for the checks: made if missing (each missing level by this call's
    own mkdir, so it is provably ours) and those levels removed again on exit."""
    made: list[Path] = []
    try:
        for level in reversed([path, *path.parents]):
            if not level.exists():
                level.mkdir()
                made.append(level)
        yield path
    finally:
        for level in reversed(made):
            with contextlib.suppress(OSError):
                level.rmdir()


def filesystem_of(path: Path) -> tuple[str, str, str]:
    """(type, device, mount point) of the filesystem holding `path` (longest mount prefix)."""
    real = os.path.realpath(_existing_ancestor(path))
    best = ("unknown", "", "")
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[2]):
            best = (part.fstype, part.device, mount)
    return best


def _probe_prefix() -> str:
    """The name of a probe file of this process, before own_file's random part."""
    return f".kvrepro-doctor-{os.getpid()}-"


def _stamp(piece: mmap.mmap, offset: int) -> None:
    """Mark a piece of the probe with its offset, so a piece read back from elsewhere in the
    file (or another file) is told apart from the one written there."""
    piece[:8] = struct.pack("<Q", offset)


def _write_all(fd: int, view: memoryview) -> None:
    """Write all of `view`; after a short write (a filesystem filling up) the next one
    raises the filesystem's own error, e.g. ENOSPC."""
    written = 0
    while written < len(view):
        with view[written:] as rest:  # released even on error: the mmap must close after
            count = os.write(fd, rest)
        if count == 0:
            raise OSError(errno.ENOSPC, "no byte written")
        written += count


def _set_direct(fd: int) -> None:
    """Switch `fd` to O_DIRECT; EINVAL where the filesystem refuses it. Why not O_DIRECT at
    open: an open with O_CREAT that is refused so has already made the file, which then has no
    descriptor of ours to prove it is ours to remove."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)


def _round_trip(fd: int, size: int) -> None:
    """Write `size` bytes to `fd` in pieces, fsync, read them back and compare (OSError EIO
    when other bytes come back); two page-aligned pieces of RAM, whatever `size` is. Every
    view of the buffers is released on the way out, error or not: a live one would turn the
    error into mmap's BufferError."""
    pieces = range(0, size, PIECE_BYTES)
    with mmap.mmap(-1, PIECE_BYTES) as out, mmap.mmap(-1, PIECE_BYTES) as back:
        out.write(os.urandom(PIECE_BYTES))
        with memoryview(out) as written, memoryview(back) as read:
            for offset in pieces:
                _stamp(out, offset)
                with written[:min(PIECE_BYTES, size - offset)] as piece:
                    _write_all(fd, piece)
            os.fsync(fd)
            for offset in pieces:
                length = min(PIECE_BYTES, size - offset)
                _stamp(out, offset)
                with read[:length] as got, written[:length] as want:
                    if os.preadv(fd, [got], offset) != length or got != want:
                        raise OSError(errno.EIO, "O_DIRECT read back other bytes than "
                                      "were written")


def probe_bytes(chunk_bytes: int) -> int:
    """What the probe writes: one chunk, capped at `PROBE_CAP_BYTES`, in whole blocks."""
    return -(-min(chunk_bytes, PROBE_CAP_BYTES) // ALIGN_BYTES) * ALIGN_BYTES


def odirect_round_trip(folder: Path, chunk_bytes: int) -> str:
    """Write one chunk (capped) with O_DIRECT into a new file of ours in `folder`, read it
    back with O_DIRECT, compare, remove the file; all through the descriptor that made it.
    Returns what happened; raises OSError on failure."""
    size = probe_bytes(chunk_bytes)
    with own_file(folder, _probe_prefix()) as (_path, fd):
        _set_direct(fd)
        _round_trip(fd, size)
    capped = (f", capped at {PROBE_CAP_BYTES:,} B (PROBE_CAP_BYTES)"
              if chunk_bytes > PROBE_CAP_BYTES else "")
    return f"{size:,} B written and read back (one chunk of {chunk_bytes:,} B{capped})"


def _odirect_why(err: OSError, chunk_bytes: int) -> str:
    if err.errno == errno.EINVAL:
        return "the filesystem refuses O_DIRECT (EINVAL)"
    if err.errno == errno.ENOSPC:
        return f"no space for one chunk of {chunk_bytes:,} B (ENOSPC)"
    return f"{err.strerror or err} ({errno.errorcode.get(err.errno or 0, err.errno)})"


NETWORK_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smb3", "lustre", "ceph", "fuse.cephfs",
                       "glusterfs", "fuse.glusterfs", "beegfs", "gpfs", "fuse.juicefs",
                       "9p", "virtiofs", "efs", "fuse.gcsfuse", "fuse.s3fs"}
"""Filesystems other servers can mount too: a shared store's folder on another one is shared
only by the servers of this machine (the doctor says so, and passes it)."""


def _label(folder: StoreFolder) -> str:
    """How the checks of a folder are named: `shared` (a fleet's shared store) or `flash`."""
    return "shared" if folder.shared else "flash"


def _filesystem_check(subject: str, store: StoreBase, folder_spec: StoreFolder, folder: Path
                      ) -> tuple[Check, bool]:
    """The filesystem line, and whether the folder lies where the spec's drive array is not
    (its array not mounted: the root filesystem instead)."""
    label, bill = _label(folder_spec), store.bill()
    fstype, device, mount = filesystem_of(folder)
    in_memory, pseudo = fstype in IN_MEMORY_FILESYSTEMS, fstype in PSEUDO_FILESYSTEMS
    unmounted = bool(bill.drives) and mount == "/"
    where = ""
    if folder_spec.shared and not (in_memory or pseudo):
        where = ("; a network filesystem" if fstype in NETWORK_FILESYSTEMS else
                 "; a local filesystem: only the servers of this machine share it")
    return Check(
        f"{label} filesystem", subject, not (in_memory or pseudo or unmounted),
        f"{fstype} ({device} on {mount})"
        + ("; a kernel filesystem, not storage" if pseudo else "")
        + (f"; in memory: the {label} tier would measure DRAM" if in_memory and not pseudo
           else "") + where
        + (f"; the root filesystem, not the {bill.drives}-drive {bill.raid_level or ''} "
           "array the spec names: is it mounted there?" if unmounted else "")), unmounted


def _path_and_probe(subject: str, store: StoreBase, folder_spec: StoreFolder, folder: Path,
                    runs_dir: Path, chunk_bytes: int, unmounted: bool) -> list[Check]:
    """The path line (the run's own refusals, `DiskFolder.check`, then a file of ours made
    there) and, for a flash folder, the O_DIRECT line (not tried where the run refuses the
    folder or the spec's array is not mounted). A shared folder gets no O_DIRECT line: its
    store reads and writes through the page cache (LMCache's `fs` adapter)."""
    label, probe = _label(folder_spec), not folder_spec.shared

    def not_tried(why: str) -> list[Check]:
        return [Check(f"{label} O_DIRECT", subject, False, f"not tried: {why}")] if probe else []

    existed = "exists" if folder.is_dir() else "can be made"
    try:
        if RUN_DIR not in folder_spec.path:  # else a new folder in the run's own: nothing
            store_folder_owner(folder_spec, runs_dir).check()  # there to refuse
    except FolderRefused as err:
        return [Check(f"{label} path", subject, False, f"{err} (a run refuses it)"),
                *not_tried("a run refuses this folder")]
    except OSError as err:
        return [Check(f"{label} path", subject, False, f"{folder}: {err.strerror or err}"),
                *not_tried("the folder cannot be read")]
    try:
        with made_folder(folder):
            with own_file(folder, _probe_prefix()):
                pass  # writable: a file of ours can be made there
            path = Check(f"{label} path", subject, True, f"{folder} {existed}, writable")
            if not probe:
                return [path]
            if unmounted:
                return [path, *not_tried("the spec's drive array is not mounted; no probe "
                                         "written on the root filesystem")]
            io_mode = getattr(store, "io_mode", "buffered")
            try:
                odirect = Check(f"{label} O_DIRECT", subject, True, odirect_round_trip(
                    folder, chunk_bytes) + f" (io_mode {io_mode})")
            except OSError as err:
                odirect = Check(f"{label} O_DIRECT", subject, False,
                                _odirect_why(err, probe_bytes(chunk_bytes)))
    except OSError as err:
        return [Check(f"{label} path", subject, False, f"{folder}: cannot be made or written: "
                      f"{err.strerror or err}"), *not_tried("the folder cannot be made")]
    return [path, odirect]


def folder_checks(subject: str, store: StoreBase, folder_spec: StoreFolder, chunk_bytes: int,
                  runs_dir: Path) -> list[Check]:
    """The checks of one store folder: path, space, filesystem and, for a flash folder,
    O_DIRECT (the checks are named `flash ...` or `shared ...`)."""
    folder = folder_path(folder_spec, runs_dir)
    filesystem, unmounted = _filesystem_check(subject, store, folder_spec, folder)
    free = shutil.disk_usage(_existing_ancestor(folder)).free
    space = Check(f"{_label(folder_spec)} space", subject, free >= store.capacity_bytes,
                  f"{free / GB:,.2f} GB free; the store holds up to "
                  f"{store.capacity_bytes / GB:,.2f} GB")
    path, *odirect = _path_and_probe(subject, store, folder_spec, folder, runs_dir,
                                     chunk_bytes, unmounted)
    return [path, space, filesystem, *odirect]


def folder_path(folder: StoreFolder, runs_dir: Path) -> Path:
    """Where a store writes: its folder's path (`file://` or not, as a run reads it), or,
    for a folder in the run's own (`{run_dir}/...`), the runs folder it will be made in."""
    return runs_dir if RUN_DIR in folder.path else flash_path(folder.path)


# --------------------------------------------------------------------------- the rest


def fio_check() -> Check:
    fio = shutil.which("fio")
    if fio is None:
        return Check("fio", "", False, "fio not on PATH: `make fio` (kvrepro.storage measures "
                     "the flash tier with it)")
    version = subprocess.run([fio, "--version"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    return Check("fio", "", True, f"{version} ({fio})")


def _can_listen(host: str, port: int) -> None:
    """Bind host:port as the server would (SO_REUSEADDR, as uvicorn does); OSError where it
    cannot, e.g. `host` is not an address of this machine."""
    for family, kind, proto, _name, address in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)


def port_check(host: str, port: int) -> Check:
    """Nothing listens on host:port and the server could listen there; a host that does not
    resolve or is not this machine's fails the line, naming it."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        busy = port_in_use(host, port)
        if not busy:
            _can_listen(host, port)
    except socket.gaierror as err:
        return Check("port", "", False, f"{where}: host {host!r} does not resolve "
                     f"({err.strerror}); the servers listen on loopback: -p live.host=127.0.0.1")
    except OSError as err:
        return Check("port", "", False, f"{where}: cannot listen there ({err.strerror or err});"
                     " is it an address of this machine? -p live.host=127.0.0.1")
    return Check("port", "", not busy, f"{where} " + (
        "is in use: stop what holds it or set -p live.port=<free port>" if busy else "free"))


def version_checks(spec: ServerSpec) -> list[Check]:
    """Each pinned distribution of the server's device: installed at its pinned version."""
    checks = []
    for name, pin in pinned_packages(spec.live.device).items():
        found = installed_version(name)
        why = f"{name} {found or 'not installed'}; pinned {pin}"
        if found is None:
            why += f" (make live-{spec.live.device})"
            builds = set(VLLM_DISTRIBUTION.values())
            other = (builds - {name}).pop() if name in builds else None
            if other and installed_version(other):
                why += f"; {other} {installed_version(other)} is, the build for the other device"
        checks.append(Check("version", name, found == pin, why))
    return checks


def model_check(model: str) -> Check:
    """The model vLLM loads: the tiny model (written locally), a readable folder with a
    config.json, or a hub name already in the Hugging Face cache (no download at start)."""
    if model == TINY_MODEL:
        from kvrepro.engines.tiny_model import tiny_model_dir

        folder = tiny_model_dir()
        state = "written" if (folder / "config.json").is_file() else "written at first start"
        return Check("model", "", True, f"{TINY_MODEL}: local, {state} ({folder})")
    path = Path(model).expanduser()
    if path.exists():
        config = path / "config.json"
        ok = config.is_file() and os.access(config, os.R_OK)
        return Check("model", "", ok, f"{path}: " + ("config.json readable" if ok else
                                                     "no readable config.json"))
    if model.startswith(("/", ".", "~")):
        return Check("model", "", False, f"{path}: no such folder")
    cached = _hub_cache(model)
    return Check("model", "", cached is not None, f"{model}: " + (
        f"in the Hugging Face cache ({cached})" if cached else "not a local folder and not in "
        "the Hugging Face cache: vLLM would download it at start; download it first or set "
        "-p live.model=<folder>"))


def _hub_cache(repo_id: str) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repo id
        return None
    return str(Path(found).parent) if isinstance(found, str) else None


# --------------------------------------------------------------------------- the report


def doctor(spec: ServerSpec, tiers: list[str] | None = None, runs_dir: str | Path = "runs",
           gpus: tuple[list[Gpu], str] | None = None) -> list[Check]:
    """Every check of `spec` (its `tiers`, default all); `gpus` replaces nvidia-smi's list."""
    names = list(tiers or spec.tiers)
    for name in names:
        spec.tier(name)  # an unknown tier is an error naming it
    checks: list[Check] = []
    if spec.live.device == "gpu":
        checks += gpu_checks(spec, names, *(gpus or find_gpus()))
    else:
        checks.append(cpu_check(spec))
    checks += dram_checks(spec, names, psutil.virtual_memory().available)
    kv_per_token = spec.model_spec().kv_bytes_per_token
    for name in names:
        tier = spec.tier(name)
        stores = {store.name: store for store in tier.stores}
        for folder in tier.folders():
            checks += folder_checks(f"{name}/{folder.store}", stores[folder.store], folder,
                                    tier.chunk_tokens * kv_per_token, Path(runs_dir))
    checks += [fio_check(), port_check(spec.live.host, spec.live.port), *version_checks(spec),
               model_check(spec.live.model)]
    return checks


def format_checks(checks: list[Check]) -> str:
    """The report as a table: check, subject, PASS / FAIL, why."""
    rows = [("check", "tier/store", "result", "why")]
    rows += [(c.check, c.subject, "pass" if c.ok else "FAIL", c.why) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    failed = sum(not c.ok for c in checks)
    lines.append(f"\n{len(checks) - failed} passed, {failed} failed")
    return "\n".join(lines)


def as_records(checks: list[Check]) -> list[dict[str, object]]:
    return [asdict(c) for c in checks]


def json_target_problem(path: str | Path) -> str | None:
    """Why `--json PATH` cannot be written (asked before the checks run), or None."""
    path = Path(path)
    if path.is_dir():
        return f"--json {path}: is a folder; name a file"
    if not path.parent.is_dir():
        return f"--json {path}: its folder {path.parent} does not exist"
    return None
