"""Directories that must be private to the user: the fileroot, records, secrets, logs.

A directory another user owns, or can write to, lets that user plant or replace what
corral reads there (name-resolve records, secrets, scripts). ``check_private_dir``
refuses such a directory, and any ancestor another user could use to swap it, with a
``ConfigError`` naming the path and the fix.
"""

from __future__ import annotations

import os
import stat

from corral.errors import ConfigError


def user_name() -> str:
    """The name of the real user this process runs as (not $USER, which may lie)."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (KeyError, ImportError):
        try:
            import getpass

            return getpass.getuser()
        except (KeyError, OSError):
            return str(os.getuid())


def default_fileroot() -> str:
    """``/tmp/corral-<user>``: one per user, so no other user can pre-create it for you."""
    return os.path.join("/tmp", f"corral-{user_name()}")


def _owner(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return f"uid {uid}"


def check_private_dir(path: str, field: str) -> str:
    """Refuse ``path`` if another user owns it or can write to it, or can replace it
    (an ancestor owned by another user, or writable by others without the sticky bit)."""
    me = os.geteuid()
    real = os.path.realpath(path)
    st = os.stat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(field, path, "it is not a directory; use a directory you own")
    if st.st_uid != me:
        raise ConfigError(
            field,
            path,
            f"it belongs to {_owner(st.st_uid)}, not to you, who could plant records or "
            f"secrets in it; remove it (or ask its owner to) or use a directory you own",
        )
    if st.st_mode & 0o022:
        raise ConfigError(
            field,
            path,
            f"other users can write to it (mode {stat.S_IMODE(st.st_mode):o}); "
            f"run `chmod go-w {real}` or use a private directory",
        )
    parent = real
    while parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
        pst = os.stat(parent)
        others_write = pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX
        if pst.st_uid not in (0, me) or others_write:
            raise ConfigError(
                field,
                path,
                f"its parent {parent} can be changed by another user "
                f"({_owner(pst.st_uid)}, mode {stat.S_IMODE(pst.st_mode):o}), who could "
                "replace it; use a directory under one only you and root control",
            )
    return path


def ensure_private_dir(path: str, field: str) -> str:
    """Create ``path`` (mode 0700, parents as needed) unless it exists; then check it."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            field, path, f"cannot create it ({exc.strerror}); use a writable directory"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(field, path, "it is not writable; use a writable directory")
    return check_private_dir(path, field)


def make_private_subdir(path: str) -> str:
    """Create ``path`` and missing parents with mode 0700 (below a checked root)."""
    missing = []
    head = path
    while head and not os.path.isdir(head):
        missing.append(head)
        head = os.path.dirname(head)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    return path


def write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), replacing it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def open_private_append(path: str):
    """``open(path, "ab", buffering=0)``, creating the file with mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return os.fdopen(fd, "ab", buffering=0)


def write_exclusive(path: str, text: str) -> None:
    """Create ``path`` (0600) holding ``text``; a file already there (a dead run's) is
    removed first, and ``O_EXCL | O_NOFOLLOW`` keep a planted file or link from being used."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
