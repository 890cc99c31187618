"""In-process name-resolve for unit tests: workers in other processes cannot see it."""

from __future__ import annotations

import threading
import time

from corral.discovery.base import KEY_SEP, NameResolve, check_key
from corral.errors import NameResolveError


class MemoryNameResolve(NameResolve):
    def __init__(self) -> None:
        self._data: dict[str, str] = {}
        self._changed = threading.Condition()

    def add(self, key: str, value: str, replace: bool = False) -> None:
        check_key(key)
        with self._changed:
            if not replace and key in self._data:
                raise NameResolveError(f"name-resolve key {key!r} already exists")
            self._data[key] = value
            self._changed.notify_all()

    def get(self, key: str) -> str | None:
        check_key(key)
        with self._changed:
            return self._data.get(key)

    def get_all(self) -> dict[str, str]:
        with self._changed:
            return dict(self._data)

    def get_subtree(self, prefix: str) -> dict[str, str]:
        check_key(prefix)
        head = prefix + KEY_SEP
        with self._changed:
            return {k: v for k, v in self._data.items() if k.startswith(head)}

    def delete(self, key: str) -> None:
        check_key(key)
        with self._changed:
            self._data.pop(key, None)

    def clear_subtree(self, prefix: str) -> None:
        check_key(prefix)
        head = prefix + KEY_SEP
        with self._changed:
            for k in [k for k in self._data if k == prefix or k.startswith(head)]:
                del self._data[k]

    def wait(self, key: str, timeout: float | None = None, poll_interval: float = 0.01) -> str:
        check_key(key)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while key not in self._data:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"name-resolve key {key!r} did not appear within {timeout}s")
                self._changed.wait(remaining)
            return self._data[key]


class PlannedNameResolve(MemoryNameResolve):
    """A dry run's store: empty, in memory, describing the store a real run would use."""

    def __init__(self, description: dict):
        super().__init__()
        self.description = description

    def describe(self) -> dict:
        return dict(self.description)
