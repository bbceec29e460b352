"""A stand-in for vLLM + LMCache in the clean-up tests: what it leaves on the machine is real.

Started by `VllmServer` through a one-line shell script in place of vLLM's interpreter (its
arguments are ignored). It creates POSIX shared-memory segments the way vLLM and LMCache do
(`/dev/shm/psm_<tag>_<pid>` kept mapped, `lmcache_kv_<pid>_0`), writes LMCache-named chunk
files into `$FAKE_DISK_DIR`, writes the names it made to `$FAKE_READY` and sleeps until it is
killed, so its segments and files are left behind for the run's clean-up to find.
"""

import json
import mmap
import os
import sys
import time
from pathlib import Path


def segment(name: str, size: int = 4096) -> mmap.mmap:
    """Create /dev/shm/<name> and map it (the fd is closed: only the mapping holds it)."""
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, size)
    mapped = mmap.mmap(fd, size)
    os.close(fd)
    mapped[:5] = b"kvrun"
    return mapped


def main() -> None:
    tag, pid = os.environ["FAKE_TAG"], os.getpid()
    names = [f"psm_{tag}_{pid}", f"lmcache_kv_{pid}_0"]
    maps = [segment(n) for n in names]
    files = []
    disk = os.environ.get("FAKE_DISK_DIR")
    if disk:
        for i in range(3):
            path = Path(disk) / f"{tag}_{i}.data"
            path.write_bytes(b"kv" * 1024)
            files.append(str(path))
    ready = Path(os.environ["FAKE_READY"])
    tmp = ready.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": pid, "segments": names, "files": files}))
    tmp.replace(ready)
    while maps:
        time.sleep(1)


if __name__ == "__main__":
    main()
    sys.exit(0)
