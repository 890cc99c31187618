"""Small engines that exercise the worker runtime: echo, failures, sleeps, env, threads."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any


class EchoEngine:
    def __init__(self, tag: str = "echo"):
        self.tag = tag
        self.calls = 0
        self.destroyed_marker: str | None = None
        self.destroy_delay = 0.0
        self._inside = 0
        self.max_overlap = 0
        self._overlap_lock = threading.Lock()

    def noop(self) -> None:
        return None

    def echo(self, value: Any) -> Any:
        self.calls += 1
        return value

    def blob(self, nbytes: int) -> bytes:
        """``nbytes`` bytes: a large reply to a small request."""
        return bytes(nbytes)

    def add(self, a: Any, b: Any) -> Any:
        return a + b

    def count(self) -> int:
        return self.calls

    def thread_name(self) -> str:
        return threading.current_thread().name

    def slow_thread_name(self, seconds: float) -> str:
        """The thread name, after holding it for ``seconds``; ``max_overlap`` records how
        many of these ever ran at once."""
        with self._overlap_lock:
            self._inside += 1
            self.max_overlap = max(self.max_overlap, self._inside)
        time.sleep(seconds)
        with self._overlap_lock:
            self._inside -= 1
        return threading.current_thread().name

    def overlap(self) -> int:
        return self.max_overlap

    async def async_echo(self, value: Any, delay: float = 0.0) -> Any:
        await asyncio.sleep(delay)
        return value

    def getenv(self, name: str) -> str | None:
        return os.environ.get(name)

    def environ(self) -> dict[str, str]:
        """The whole in-process environment (on Ray it differs from /proc/PID/environ)."""
        return dict(os.environ)

    def loaded(self, names: list[str]) -> list[str]:
        """Which of ``names`` are imported in this worker process."""
        import sys

        return [n for n in names if n in sys.modules]

    def pid(self) -> int:
        return os.getpid()

    def torch_threads(self) -> int:
        """torch's intra-op thread count, importing torch now if it is not loaded yet."""
        import torch

        return torch.get_num_threads()

    def ray_runtime_env(self) -> dict:
        """The runtime_env Ray gave the process this engine runs in (Ray workers only)."""
        import ray

        return dict(ray.get_runtime_context().runtime_env)

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        self.calls += 1
        return seconds

    def chatter(self, lines: int, width: int = 100) -> int:
        """Print ``lines`` lines of ``width`` characters (a chatty worker); bytes printed."""
        line = "x" * (width - 1)
        for _ in range(lines):
            print(line, flush=False)
        print("", flush=True)
        return lines * width

    def say(self, text: str) -> str:
        """Print ``text`` to the worker's output (its log), flushed."""
        print(text, flush=True)
        return text

    def mark_preempt(self, path: str) -> None:
        """``on_preempt`` will write its reason to ``path`` (a checkpoint stand-in)."""
        self.preempt_marker = path

    def on_preempt(self, reason: str) -> None:
        path = getattr(self, "preempt_marker", None)
        if path:
            with open(path, "w") as fh:
                fh.write(reason)

    def fail(self, message: str = "boom") -> None:
        raise ValueError(message)

    def exit_now(self, code: int = 3) -> None:
        os._exit(code)

    def mark_destroy(self, path: str, delay: float = 0.0) -> None:
        """Make ``destroy()`` write ``path``, after ``delay`` seconds of work."""
        self.destroyed_marker = path
        self.destroy_delay = delay

    def destroy(self) -> None:
        if self.destroyed_marker:
            time.sleep(self.destroy_delay)
            with open(self.destroyed_marker, "w") as fh:
                fh.write(f"destroyed {self.tag}\n")


class FailingInitEngine:
    def __init__(self) -> None:
        raise RuntimeError("engine init failed on purpose")
