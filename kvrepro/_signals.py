"""Turning SIGINT and SIGTERM into KeyboardInterrupt, so that long runs clean up on the way
out: live campaigns (servers, LMCache, shared memory) and `kvrepro reproduce` (notebook
workers and their kernels)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def stop_on_signals() -> Iterator[list[int]]:
    """SIGINT and SIGTERM raise KeyboardInterrupt where the run is, so that every `with`
    block on the way out tears down what it started (servers, LMCache, disk folders,
    shared memory); without it SIGTERM kills the runner and orphans the servers, and
    asyncio would turn SIGINT into a quiet end of one tier. Yields the signals seen."""
    seen: list[int] = []

    def _raise(signum: int, _frame: Any) -> None:
        seen.append(signum)
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    if threading.current_thread() is not threading.main_thread():
        yield seen
        return
    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield seen
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
