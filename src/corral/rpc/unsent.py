"""The reply frames of a connection's batches, sent together where no reply can be held.

A batch of request frames (``RPCServer._serve_frames``) runs on the engine thread, and
each reply frame it makes is added here. After each call the engine thread sends what is
here, unless the connection's own thread is *watching*: waiting at most ``BOUND`` seconds
at a time for the socket to bring more, and sending what is here each time it wakes. So
no reply waits for a later call of its batch for more than about ``BOUND`` (and the GIL),
however long that call runs or blocks (it may block on what the client does once it has
the reply: review 16), while a batch of quick calls sends its replies in one write, or a
few, instead of one each.

The watch ends when the batch has run (the engine thread sends the rest after its last
call), when the socket has more to read, or after ``EMPTY_WAKES`` wakes in a row that
found nothing to send (a long call: the engine thread then sends each reply itself).
Whether a reply waits is decided under the connection's write lock, against
``watching``, which the watching thread sets and clears under the same lock, sending
what is here as it clears it: a reply added while it watches is sent when it wakes, one
added while it does not is sent by the engine thread after that call.
"""

from __future__ import annotations

import _socket
import select
import threading

#: the longest a reply of a batch waits for the calls after it, in seconds (a wake of the
#: watching thread)
BOUND = 0.001
#: wakes in a row with nothing to send that end a watch
EMPTY_WAKES = 3


class Unsent:
    """One connection's reply frames not yet sent (``append`` them), and its watch."""

    __slots__ = ("sock", "lock", "frames", "watching", "_poll")

    def __init__(self, sock: _socket.socket, lock: threading.Lock):
        """``lock``: the connection's write lock (one writer at a time on ``sock``)."""
        self.sock = sock
        self.lock = lock
        self.frames: list[bytes] = []
        self.watching = False
        self._poll = None

    def append(self, frame: bytes) -> None:
        """A reply frame of a batch (``frames.reply_frame`` appends it here)."""
        with self.lock:
            self.frames.append(frame)

    def settle(self, last: bool) -> None:
        """After a call of a batch, on the engine thread: send what is here if that was
        the batch's last call, or if no one watches."""
        with self.lock:
            if self.frames and (last or not self.watching):
                self._send()

    def _send(self) -> None:
        """Send every frame here, in one write (the caller holds the lock)."""
        frames = self.frames
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        frames.clear()
        try:
            self.sock.sendall(data)
        except OSError:  # the connection's thread sees it and ends
            try:
                self.sock.shutdown(_socket.SHUT_RDWR)
            except OSError:
                pass

    def watch(self, done: threading.Event, bound: float = BOUND) -> None:
        """On the connection's thread, once it has released a batch (``done``: set when
        it has run and its replies went): wait for the socket, ``bound`` seconds at a time,
        sending what is here after each wait (see the module's doc)."""
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.sock.fileno(), select.POLLIN)
        wait_ms = bound * 1000.0
        empty = 0
        while not done.is_set() and empty < EMPTY_WAKES:
            with self.lock:
                self.watching = True
            try:
                ready = self._poll.poll(wait_ms)
            finally:
                with self.lock:
                    self.watching = False
                    found = bool(self.frames)
                    if found:
                        self._send()
            if ready:
                return
            empty = 0 if found else empty + 1
