"""The dashboard's credentials: its own, held in memory by one run of the server.

* **No cookie.** Browsers send a cookie to every port of its host, so a dashboard cookie
  for 127.0.0.1 reached any other local user's server on 127.0.0.1 (who could replay it).
  The page instead keeps a per-tab session token (``sessionStorage``) and sends it in an
  ``Authorization: Bearer`` header with each request (``static/session.js``).
* **A login code that works once.** The printed address is ``http://HOST:PORT/#login=CODE``;
  the fragment never reaches a server, a log or a ``Referer``. The page trades the code
  (``POST /api/session``) for a session token; the code is then spent.
* **Bound to this server.** Codes and session tokens are random and live only in this
  process: after a restart, any token seen before is refused. The trial secret is never a
  dashboard credential.
* **An API token** for scripts (``Authorization: Bearer``): ``CORRAL_DASHBOARD_TOKEN`` if set,
  else a random one that is never printed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict

MAX_SESSIONS = 256
MAX_LOGINS = 16


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "replace")).digest()


def bearer(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header ('' when none)."""
    scheme, _, token = (header or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class DashboardAuth:
    def __init__(self, token: str | None = None):
        self.token = token or secrets.token_urlsafe(32)
        self._token_digest = _digest(self.token)
        self._logins: OrderedDict[bytes, None] = OrderedDict()
        self._sessions: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def new_login(self) -> str:
        """A fresh one-time login code (the oldest unspent ones expire beyond 16)."""
        code = secrets.token_urlsafe(32)
        with self._lock:
            self._logins[_digest(code)] = None
            while len(self._logins) > MAX_LOGINS:
                self._logins.popitem(last=False)
        return code

    def is_login(self, code: str) -> bool:
        with self._lock:
            return bool(code) and _digest(code) in self._logins

    def exchange(self, code: str) -> str | None:
        """Spend a login code: a new session token, or None if the code is not (or no
        longer) valid."""
        if not code:
            return None
        with self._lock:
            if self._logins.pop(_digest(code), 0) is not None:
                return None
            session = secrets.token_urlsafe(32)
            self._sessions[_digest(session)] = None
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
            return session

    def authorized(self, authorization: str | None) -> bool:
        """Does this ``Authorization`` header carry the API token or a live session?
        (Looked up by SHA-256 digest, so the comparison leaks nothing about a token.)"""
        token = bearer(authorization)
        if not token:
            return False
        offered = _digest(token)
        if hmac.compare_digest(offered, self._token_digest):
            return True
        with self._lock:
            return offered in self._sessions
