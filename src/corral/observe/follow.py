"""Following a log file: its last lines, then new lines as they are written."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

TAIL_BYTES = 64 * 1024


def follow_lines(
    path: str, stop: threading.Event, last: int = 200, poll: float = 0.25
) -> Iterator[list[str]]:
    """Yield batches of complete lines: first the file's last ``last`` lines, then new
    ones. Waits for a file that does not exist yet; starts over if it is truncated.
    Yields an empty batch after each idle ``poll`` so a caller can notice a gone client."""
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
        if offset is None:
            start = max(0, size - TAIL_BYTES)
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read(size - start)
            if start > 0:
                data = data.split(b"\n", 1)[-1]  # drop the line cut in two
            *lines, partial = data.split(b"\n")
            lines = lines[-last:]
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
        if lines:
            yield [line.decode("utf-8", "replace") for line in lines]
        else:
            yield []
            stop.wait(poll)
