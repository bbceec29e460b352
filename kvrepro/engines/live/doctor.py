"""`kvrepro doctor`: check a server before a campaign, not 90 minutes into it.

Every check a live campaign would otherwise fail on late, each one line with pass / fail and
why: the GPUs (their count against tensor parallelism, their memory against the weights plus
the engine's KV budget) or, for a CPU server, the CPUs of its placement; host DRAM against the
largest L1 (and, on CPUs, the engine's memory); each flash store's folder (exists or can be
made, free space against its capacity, its filesystem, one chunk written and read back with
O_DIRECT); fio; the server's port; the installed vllm / lmcache / vllm-router against the pins
(`kvrepro.engines.live.pins`); the model. It starts no server and leaves nothing behind: the
probe file and any folder it makes are its own (created with O_EXCL / mkdir) and removed.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from kvrepro.engines.live.ownership import LOCK_NAME
from kvrepro.engines.live.pins import VLLM_DISTRIBUTION, installed_version, pinned_packages
from kvrepro.engines.live.processes import port_in_use
from kvrepro.tier_spec import TINY_MODEL, ServerSpec, StoreSpec, parse_cpu_list

VLLM_DEFAULT_GPU_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default
IN_MEMORY_FILESYSTEMS = {"tmpfs", "ramfs", "devtmpfs"}
ALIGN_BYTES = 4096  # O_DIRECT needs block-aligned buffers, offsets and sizes
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
    """Host DRAM available against each tier's DRAM stores (L1, staging; LMCache allocates
    them at start) and, on a CPU server, the engine's weights and KV budget too."""
    checks = []
    for name in tiers:
        need = sum(s.capacity_bytes for s in spec.tier(name).stores if s.kind == "dram")
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


def _files_in(folder: Path) -> int:
    """Files below `folder` a run would refuse to share it with (`DiskFolder.prepare`)."""
    return sum(name != LOCK_NAME for _root, _dirs, names in os.walk(folder) for name in names)


def _new_file(folder: Path) -> Path:
    """A new empty file in `folder`, made by this call (O_EXCL): provably ours to remove."""
    probe = folder / f".kvrepro-doctor-{os.getpid()}-{os.urandom(4).hex()}"
    os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    return probe


def _write_all(fd: int, buffer: mmap.mmap, size: int) -> None:
    """Write all of `buffer`; after a short write (a filesystem filling up) the next one
    raises the filesystem's own error, e.g. ENOSPC."""
    view, written = memoryview(buffer), 0
    try:
        while written < size:
            count = os.write(fd, view[written:])
            if count == 0:
                raise OSError(errno.ENOSPC, "no byte written")
            written += count
    finally:
        view.release()


def odirect_round_trip(folder: Path, chunk_bytes: int) -> str:
    """Write one chunk with O_DIRECT into a new file of ours in `folder`, read it back with
    O_DIRECT, compare, remove the file. Returns what happened; raises OSError on failure."""
    size = -(-chunk_bytes // ALIGN_BYTES) * ALIGN_BYTES
    out, back = mmap.mmap(-1, size), mmap.mmap(-1, size)  # page-aligned, as O_DIRECT needs
    probe = _new_file(folder)
    try:
        out.write(os.urandom(size))
        fd = os.open(probe, os.O_WRONLY | os.O_DIRECT)
        try:
            _write_all(fd, out, size)
            os.fsync(fd)
        finally:
            os.close(fd)
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
        try:
            if os.readv(fd, [back]) != size or back[:] != out[:]:
                raise OSError(errno.EIO, "O_DIRECT read back other bytes than were written")
        finally:
            os.close(fd)
    finally:
        out.close()
        back.close()
        probe.unlink()
    return f"{size:,} B written and read back"


def _odirect_why(err: OSError, chunk_bytes: int) -> str:
    if err.errno == errno.EINVAL:
        return "the filesystem refuses O_DIRECT (EINVAL)"
    if err.errno == errno.ENOSPC:
        return f"no space for one chunk of {chunk_bytes:,} B (ENOSPC)"
    return f"{err.strerror or err} ({errno.errorcode.get(err.errno or 0, err.errno)})"


def flash_checks(subject: str, store: StoreSpec, folder: Path, chunk_bytes: int) -> list[Check]:
    """The four checks of one flash store's folder."""
    fstype, device, mount = filesystem_of(folder)
    in_memory = fstype in IN_MEMORY_FILESYSTEMS
    unmounted = bool(store.drives) and mount == "/"  # the array the spec names is not there
    filesystem = Check(
        "flash filesystem", subject, not (in_memory or unmounted),
        f"{fstype} ({device} on {mount})"
        + ("; in memory: the flash tier would measure DRAM" if in_memory else "")
        + (f"; the root filesystem, not the {store.drives}-drive {store.raid_level or ''} "
           "array the spec names: is it mounted there?" if unmounted else ""))
    free = shutil.disk_usage(_existing_ancestor(folder)).free
    space = Check("flash space", subject, free >= store.capacity_bytes,
                  f"{free / GB:,.2f} GB free; the store holds up to "
                  f"{store.capacity_bytes / GB:,.2f} GB")
    existed = "exists" if folder.is_dir() else "can be made"
    try:
        with made_folder(folder):
            _new_file(folder).unlink()  # writable: a file of ours can be made there
            held = 0 if store.allow_existing_files or not store.path else _files_in(folder)
            path = Check("flash path", subject, held == 0, f"{folder} {existed}, writable" + (
                f"; holds {held} file(s): a run refuses them (empty it, choose another path, "
                "or set allow_existing_files: true)" if held else ""))
            try:
                odirect = Check("flash O_DIRECT", subject, True, odirect_round_trip(
                    folder, chunk_bytes) + f" (io_mode {store.io_mode})")
            except OSError as err:
                odirect = Check("flash O_DIRECT", subject, False, _odirect_why(err, chunk_bytes))
    except OSError as err:
        path = Check("flash path", subject, False, f"{folder}: cannot be made or written: "
                     f"{err.strerror or err}")
        odirect = Check("flash O_DIRECT", subject, False, "not tried: the folder cannot be made")
    return [path, space, filesystem, odirect]


def store_folder(store: StoreSpec, runs_dir: Path) -> Path:
    """Where a flash store writes: its path, else (`RUN_DISK_DIR`) inside a run folder."""
    return Path(store.path) if store.path else runs_dir


# --------------------------------------------------------------------------- the rest


def fio_check() -> Check:
    fio = shutil.which("fio")
    if fio is None:
        return Check("fio", "", False, "fio not on PATH: `make fio` (kvrepro.storage measures "
                     "the flash tier with it)")
    version = subprocess.run([fio, "--version"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    return Check("fio", "", True, f"{version} ({fio})")


def port_check(host: str, port: int) -> Check:
    busy = port_in_use(host, port)
    return Check("port", "", not busy, f"{host}:{port} " + (
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
        for store in (s for s in tier.stores if s.kind == "flash"):
            folder = store_folder(store, Path(runs_dir))
            checks += flash_checks(f"{name}/{store.name}", store, folder,
                                   tier.chunk_tokens * kv_per_token)
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
