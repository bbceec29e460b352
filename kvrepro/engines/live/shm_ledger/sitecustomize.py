"""Put on the PYTHONPATH of a live run's servers: each Python process of the run writes the
name and inode of every POSIX semaphore (`sem.mp-*`) and shared-memory segment (`psm_*`) it
creates, and of each it unlinks, into the run's ledger file (`$KVREPRO_SHM_LEDGER`).

Why: a multiprocessing semaphore is often mapped by no process at all for most of its life
(its creator closed it), so sampling the processes' maps cannot see it; when the server is
killed, nothing unlinks it. The ledger is the proof that the run created it
(`kvrepro.engines.live.ownership.SharedMemory`). The "unlinked" lines let the reader forget
the objects already gone, so 20,000 transient locks leave it nothing to look after; it reads
only the bytes added since its last look. One line per event, `<event> <inode> <name>`
(`created` or `unlinked`; the name last, as it may hold spaces).

Nothing here may break the server: every failure of ours is ignored, and the file has no
annotations (a Python older than the run's may import it). A `sitecustomize` this
one shadows (the next one on sys.path) is then imported as Python would have imported it: it
becomes the `sitecustomize` module, and an error in it reaches `site.py`, which prints it
("Error in sitecustomize; set PYTHONVERBOSE for traceback: ...") as it always does (with
PYTHONVERBOSE set, the traceback also shows this file's frames above the user's).
"""

import importlib
import os
import sys

_LEDGER = os.environ.get("KVREPRO_SHM_LEDGER")


def _record(event, file_name, inode=None):
    """Append one line for `/dev/shm/<file_name>` (its inode read now unless given)."""
    try:
        if "\n" in file_name:
            return
        if inode is None:
            inode = os.stat(f"/dev/shm/{file_name}").st_ino
        fd = os.open(_LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{event} {inode} {file_name}\n".encode())  # one short O_APPEND write
        finally:
            os.close(fd)
    except Exception:  # noqa: BLE001 - never break the server
        pass


def _inode(file_name):
    try:
        return os.stat(f"/dev/shm/{file_name}").st_ino
    except Exception:  # noqa: BLE001 - never break the server
        return None


def _unlinking(unlink, file_name):
    """`unlink` wrapped to record "unlinked" when it succeeded; `file_name(*args)`: the
    object's name under /dev/shm."""

    def wrapped(*args, **kwargs):
        name = inode = None
        try:
            name = file_name(*args)
            inode = _inode(name)
        except Exception:  # noqa: BLE001 - never break the server
            pass
        result = unlink(*args, **kwargs)
        if inode is not None:
            _record("unlinked", name, inode)
        return result

    return wrapped


def _patch():
    from multiprocessing import shared_memory, synchronize

    semlock_init = synchronize.SemLock.__init__
    shm_init = shared_memory.SharedMemory.__init__

    def semlock(self, *args, **kwargs):
        semlock_init(self, *args, **kwargs)
        name = getattr(self._semlock, "name", None)  # None: unlinked at once
        if name:
            _record("created", "sem." + name.lstrip("/"))

    def shm(self, name=None, create=False, size=0, *args, **kwargs):
        shm_init(self, name, create, size, *args, **kwargs)
        if create:
            _record("created", self._name.lstrip("/"))

    synchronize.SemLock.__init__ = semlock
    shared_memory.SharedMemory.__init__ = shm
    # SemLock._cleanup (its finalizer) calls this module global of synchronize's
    synchronize.sem_unlink = _unlinking(synchronize.sem_unlink,
                                        lambda name: "sem." + name.lstrip("/"))
    shared_memory.SharedMemory.unlink = _unlinking(shared_memory.SharedMemory.unlink,
                                                   lambda self: self._name.lstrip("/"))


def _chain():
    """Import the sitecustomize this file shadows (if any) as the `sitecustomize` module:
    Python's import of this file returns whatever `sys.modules["sitecustomize"]` holds when
    the file is done, so the user's module (its attributes, not ours) is what `import
    sitecustomize` gives from then on. An error in it is not caught: `site.py` prints it."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    this = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ImportError as err:
        if err.name != "sitecustomize":  # an import inside the user's module failed
            raise
        if this is not None:  # there is none: this file stays the module
            sys.modules["sitecustomize"] = this


if _LEDGER:
    try:
        _patch()
    except Exception:  # noqa: BLE001 - never break the server
        pass
_chain()
