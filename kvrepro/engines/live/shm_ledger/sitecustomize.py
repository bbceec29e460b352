"""Put on the PYTHONPATH of a live run's servers: each Python process of the run writes the
name and inode of every POSIX semaphore (`sem.mp-*`) and shared-memory segment (`psm_*`) it
creates into the run's ledger file (`$KVREPRO_SHM_LEDGER`).

Why: a multiprocessing semaphore is often mapped by no process at all for most of its life
(its creator closed it), so sampling the processes' maps cannot see it; when the server is
killed, nothing unlinks it. The ledger is the proof that the run created it
(`kvrepro.engines.live.ownership.SharedMemory`). Nothing here may break the server: every
failure is ignored. A `sitecustomize` this one shadows still runs.
"""

import importlib
import os
import sys

_LEDGER = os.environ.get("KVREPRO_SHM_LEDGER")


def _record(file_name: str) -> None:
    try:
        inode = os.stat(f"/dev/shm/{file_name}").st_ino
        fd = os.open(_LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{file_name} {inode}\n".encode())  # one short O_APPEND write
        finally:
            os.close(fd)
    except Exception:  # noqa: BLE001 - never break the server
        pass


def _patch() -> None:
    from multiprocessing import shared_memory, synchronize

    semlock_init = synchronize.SemLock.__init__
    shm_init = shared_memory.SharedMemory.__init__

    def semlock(self, *args, **kwargs):
        semlock_init(self, *args, **kwargs)
        name = getattr(self._semlock, "name", None)  # None: unlinked at once
        if name:
            _record("sem." + name.lstrip("/"))

    def shm(self, name=None, create=False, size=0, *args, **kwargs):
        shm_init(self, name, create, size, *args, **kwargs)
        if create:
            _record(self._name.lstrip("/"))

    synchronize.SemLock.__init__ = semlock
    shared_memory.SharedMemory.__init__ = shm


def _chain() -> None:
    """Run the sitecustomize this file shadows (if any), as Python would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    this = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:  # Python's import of this file reads its entry back when the file is done
        if this is not None:
            sys.modules["sitecustomize"] = this


if _LEDGER:
    try:
        _patch()
    except Exception:  # noqa: BLE001 - never break the server
        pass
_chain()
