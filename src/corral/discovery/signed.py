"""Name-resolve whose records are signed with the trial secret.

Whoever can write to the store (a shared directory, an etcd without authentication) could
otherwise point the controller at an address of their choosing. Every value this wrapper
writes carries an HMAC over its key and value made with the trial's record key; a value
that lacks one or whose signature is wrong is refused with ``ForgedRecordError`` naming
the key and the store. A forged address is therefore never connected to.
"""

from __future__ import annotations

from corral.auth import TrialKeys, open_record, sign_record, unverified_value
from corral.discovery.base import NameResolve
from corral.errors import NameResolveError


class ForgedRecordError(NameResolveError):
    """A name-resolve record was not written by this trial's controller or workers."""


class SignedNameResolve(NameResolve):
    """Wraps ``inner``; values are signed on ``add`` and checked on every read."""

    def __init__(self, inner: NameResolve, secret: str, lenient: bool = False):
        """``lenient``: reads return a record's value even if it is not signed with this
        key (for the controller lease, which a new run reads to decide whether the trial is
        still held; workers read it strictly)."""
        self.inner = inner
        self._keys = TrialKeys(secret)
        self._lenient = lenient

    def _open(self, key: str, stored: str) -> str:
        value = open_record(self._keys, key, stored)
        if value is None and self._lenient:
            return unverified_value(stored)
        if value is None:
            where = self.inner.describe() if _describable(self.inner) else type(self.inner)
            state = "unsigned" if not stored.startswith("corral-signed") else "wrongly signed"
            raise ForgedRecordError(
                f"name-resolve record {key!r} in {where} is {state}: it was not written by "
                "this trial's worker or controller, so it is refused (nothing was sent to the "
                "address it names). Someone else can write to this store: use a private "
                "fileroot / record directory, or an etcd that only you can write to "
                "(docs/security.md)"
            )
        return value

    def add(self, key: str, value: str, replace: bool = False) -> None:
        self.inner.add(key, sign_record(self._keys, key, value), replace=replace)

    def get(self, key: str) -> str | None:
        stored = self.inner.get(key)
        return None if stored is None else self._open(key, stored)

    def get_subtree(self, prefix: str) -> dict[str, str]:
        return {k: self._open(k, v) for k, v in self.inner.get_subtree(prefix).items()}

    def get_all(self) -> dict[str, str]:
        return {k: self._open(k, v) for k, v in self.inner.get_all().items()}

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def clear_subtree(self, prefix: str) -> None:
        self.inner.clear_subtree(prefix)

    def wait(self, key: str, timeout: float | None = None, poll_interval: float = 0.01) -> str:
        return self._open(key, self.inner.wait(key, timeout, poll_interval))

    def close(self) -> None:
        self.inner.close()

    def describe(self) -> dict:
        return self.inner.describe()


def _describable(store: NameResolve) -> bool:
    try:
        store.describe()
    except NameResolveError:
        return False
    return True
