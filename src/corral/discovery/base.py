"""The name-resolve contract: a small key-value store that workers publish themselves in."""

from __future__ import annotations

import abc
import time

from corral.errors import ConfigError, NameResolveError

KEY_SEP = "/"


def check_key(key: str) -> str:
    """Refuse keys that could escape the store's root (absolute paths, '..', empty parts)."""
    if not isinstance(key, str) or not key:
        raise ConfigError("name_resolve key", key, "use a non-empty 'a/b/c' key")
    parts = key.split(KEY_SEP)
    for part in parts:
        if part in ("", ".", "..") or part.startswith(".") or "\x00" in part or "\\" in part:
            raise ConfigError(
                "name_resolve key", key, "use parts without '.', '..', leading dots or empty parts"
            )
    return key


class NameResolve(abc.ABC):
    """Keys are '/'-separated paths. Values are short strings."""

    @abc.abstractmethod
    def add(self, key: str, value: str, replace: bool = False) -> None:
        """Store ``value``. Raises NameResolveError if the key exists and not ``replace``."""

    @abc.abstractmethod
    def get(self, key: str) -> str | None:
        """The value of ``key``, or None."""

    @abc.abstractmethod
    def get_subtree(self, prefix: str) -> dict[str, str]:
        """Every key below ``prefix`` (not the prefix itself) with its value."""

    @abc.abstractmethod
    def get_all(self) -> dict[str, str]:
        """Every key in the store (for listing experiments)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; no error if it is absent."""

    @abc.abstractmethod
    def clear_subtree(self, prefix: str) -> None:
        """Remove ``prefix`` and every key below it."""

    def wait(self, key: str, timeout: float | None = None, poll_interval: float = 0.01) -> str:
        """Block until ``key`` exists; return its value. Raises TimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = poll_interval
        while True:
            value = self.get(key)
            if value is not None:
                return value
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"name-resolve key {key!r} did not appear within {timeout}s")
            time.sleep(interval)
            interval = min(interval * 1.5, 0.1)

    def close(self) -> None:
        """Release connections. Entries stay."""

    def describe(self) -> dict:
        """A JSON-able description a worker process can rebuild this store from."""
        raise NameResolveError(f"{type(self).__name__} cannot be shared with worker processes")
