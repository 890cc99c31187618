"""Name-resolve on a (shared) filesystem: one small file per key, written atomically."""

from __future__ import annotations

import os

from corral.discovery.base import KEY_SEP, NameResolve, check_key
from corral.errors import ConfigError, NameResolveError
from corral.safedirs import check_private_dir, make_private_subdir

_VALUE_FILE = ".value"


class FileNameResolve(NameResolve):
    """Each key is a directory holding a ``.value`` file; writes go to a temp file then
    ``link``/``rename`` so readers (also over NFS) never see half a value."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        try:
            make_private_subdir(self.root)
        except OSError as exc:
            raise ConfigError(
                "cluster.name_resolve.nfs_record_root",
                root,
                f"cannot create it ({exc.strerror}); use a writable directory on a filesystem "
                "every node shares",
            ) from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ConfigError(
                "cluster.name_resolve.nfs_record_root",
                root,
                "it is not writable; use a writable directory on a filesystem every node shares",
            )
        # another user who can write here could plant records: refuse (records are also
        # signed, see discovery/signed.py, so a planted one would be refused anyway)
        check_private_dir(self.root, "cluster.name_resolve.nfs_record_root")

    def _path(self, key: str) -> str:
        check_key(key)
        return os.path.join(self.root, *key.split(KEY_SEP))

    def add(self, key: str, value: str, replace: bool = False) -> None:
        directory = self._path(key)
        make_private_subdir(directory)
        target = os.path.join(directory, _VALUE_FILE)
        # a fresh name made O_EXCL, as tempfile.mkstemp would (whose import, with shutil and
        # random, is a large part of a worker's start)
        tmp = os.path.join(directory, f".tmp-{os.getpid()}-{os.urandom(8).hex()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(value)
            if replace:
                os.replace(tmp, target)
            else:
                try:
                    os.link(tmp, target)
                except FileExistsError:
                    raise NameResolveError(f"name-resolve key {key!r} already exists") from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def get(self, key: str) -> str | None:
        try:
            with open(os.path.join(self._path(key), _VALUE_FILE)) as fh:
                return fh.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def get_subtree(self, prefix: str) -> dict[str, str]:
        return self._walk(self._path(prefix))

    def get_all(self) -> dict[str, str]:
        return self._walk(self.root)

    def _walk(self, base: str) -> dict[str, str]:
        found: dict[str, str] = {}
        for dirpath, _dirs, files in os.walk(base):
            if _VALUE_FILE in files and dirpath != base:
                rel = os.path.relpath(dirpath, self.root).replace(os.sep, KEY_SEP)
                try:
                    with open(os.path.join(dirpath, _VALUE_FILE)) as fh:
                        found[rel] = fh.read()
                except FileNotFoundError:
                    continue
        return found

    def delete(self, key: str) -> None:
        try:
            os.unlink(os.path.join(self._path(key), _VALUE_FILE))
        except FileNotFoundError:
            pass

    def clear_subtree(self, prefix: str) -> None:
        import shutil

        shutil.rmtree(self._path(prefix), ignore_errors=True)

    def describe(self) -> dict:
        return {"type": "nfs", "root": self.root}
