"""Following a log file: its last lines (or every line matching a search), then new
lines as they are written."""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterator

TAIL_BYTES = 1024 * 1024  # read back from the end for the first lines
SEARCH_MATCHES = 2000  # a search sends the last this many matching lines of the file first


def follow_lines(
    path: str,
    stop: threading.Event,
    last: int = 2000,
    poll: float = 0.25,
    match: str | None = None,
) -> Iterator[list[str]]:
    """Yield batches of complete lines: first the file's last ``last`` lines, then new
    ones. Waits for a file that does not exist yet; starts over if it is truncated.
    Yields an empty batch after each idle ``poll`` so a caller can notice a gone client.
    ``match``: only lines holding this text (case-insensitive); the first batch is then
    the last ``SEARCH_MATCHES`` matching lines of the whole file, not only of its tail."""
    needle = match.lower().encode() if match else None
    offset: int | None = None
    partial = b""
    while not stop.is_set():
        try:
            size = os.path.getsize(path)
        except OSError:
            yield []
            stop.wait(poll)
            continue
        lines: list[bytes] = []
        if offset is None and needle is not None:
            lines, offset, partial = _search_whole(path, size, needle)
        elif offset is None:
            start = max(0, size - TAIL_BYTES)
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read(size - start)
            if start > 0:
                data = data.split(b"\n", 1)[-1]  # drop the line cut in two
            *lines, partial = data.split(b"\n")
            lines = lines[-last:] if last else []
            offset = size
        elif size < offset:  # truncated or replaced: read it again from the start
            offset, partial = 0, b""
            continue
        elif size > offset:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(min(size - offset, 4 * TAIL_BYTES))
            offset += len(data)
            *lines, partial = (partial + data).split(b"\n")
            if needle is not None:
                lines = [line for line in lines if needle in line.lower()]
        if lines:
            yield [line.decode("utf-8", "replace") for line in lines]
        else:
            yield []
            stop.wait(poll)


def _search_whole(path: str, size: int, needle: bytes) -> tuple[list[bytes], int, bytes]:
    """The last matching complete lines of the first ``size`` bytes, the offset read to,
    and the incomplete last line."""
    found: deque[bytes] = deque(maxlen=SEARCH_MATCHES)
    partial = b""
    with open(path, "rb") as fh:
        left = size
        while left > 0:
            data = fh.read(min(left, TAIL_BYTES))
            if not data:
                break
            left -= len(data)
            *lines, partial = (partial + data).split(b"\n")
            found.extend(line for line in lines if needle in line.lower())
    return list(found), size - left, partial
