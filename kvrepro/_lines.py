"""Lines of a file read one by one with a bound on their length.

Why: every reader of the package (run records, traces, telemetry exports) takes files from
outside, and one line without a newline (a cut export, a binary file, a 200 MB blob) must
not be read into memory whole. `bounded_lines` streams a byte handle and never holds more
than `max_line_bytes` (+1) of one line; a longer line is drained in blocks and handed to the
caller as `None`, so a strict reader raises `line_too_long(...)` and a lax one skips it and
goes on with the next line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

MAX_LINE_BYTES = 32 * 2**20
"""The longest line (without its newline) any reader accepts: 32 MiB."""

_DRAIN_BYTES = 2**20


def bounded_lines(handle: IO[bytes],
                  max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes | None]]:
    """Yield (1-based line number, line with its newline) for each line of `handle`;
    a line longer than `max_line_bytes` (its newline not counted) comes as (number, None)
    after being read past in blocks of 1 MiB."""
    number = 0
    while True:
        raw = handle.readline(max_line_bytes + 1)
        if not raw:
            return
        number += 1
        if len(raw) <= max_line_bytes or raw.endswith(b"\n"):
            yield number, raw
            continue
        while raw and not raw.endswith(b"\n"):  # drain the rest of the long line
            raw = handle.readline(_DRAIN_BYTES)
        yield number, None


def line_too_long(source: object, number: int, max_line_bytes: int = MAX_LINE_BYTES) -> str:
    """The message for a line over the limit: file, line and the limit it broke."""
    return (f"{source}:{number}: line longer than {max_line_bytes:,} bytes (the reader's "
            "max_line_bytes limit); not a line of this format, or a file without newlines?")
