"""Name-resolve on etcd v3, spoken through etcd's JSON gRPC-gateway with the standard library.

Every entry this process adds is bound to one lease that a daemon thread keeps alive, so the
entries of a process that dies disappear after ``ttl`` seconds. Needs etcd >= 3.4 (``/v3/`` paths).
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import math
import socket
import threading
import time
from typing import Any

from corral.discovery.base import KEY_SEP, NameResolve, check_key
from corral.errors import ConfigError, NameResolveError

logger = logging.getLogger(__name__)

DEFAULT_PORT = 2379
DEFAULT_ROOT = "corral"
DEFAULT_TTL = 10.0
_ADDR_FIELD = "cluster.name_resolve.etcd3_addr"
# A watch is reopened this often, so a silently dead connection cannot block wait() forever.
_WATCH_SLICE = 10.0
_GRPC_NOT_FOUND = 5


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _unb64(data: str) -> str:
    return base64.b64decode(data).decode()


def parse_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` (``http://`` and ``[ipv6]`` allowed; port defaults to 2379)."""
    text = str(address or "").strip()
    if "://" in text:
        scheme, text = text.split("://", 1)
        if scheme != "http":
            raise ConfigError(_ADDR_FIELD, address, "use host:port or http://host:port (no TLS)")
    text = text.rstrip("/")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not host or "," in text or "/" in host:
        raise ConfigError(_ADDR_FIELD, address, "use host:port of one etcd client endpoint")
    if not port_text:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(_ADDR_FIELD, address, "the port must be a number in 1..65535")
    return host, int(port_text)


class EtcdRequestError(NameResolveError):
    """etcd answered, but refused the request. ``code`` is the gRPC status code."""

    def __init__(self, message: str, code: int | None = None, status: int | None = None):
        self.code = code
        self.status = status
        super().__init__(message)


class _WatchUnavailable(Exception):
    """The watch endpoint did not work; wait() falls back to polling."""


class _Gateway:
    """One HTTP request per call to etcd's JSON gateway; every failure is a NameResolveError."""

    def __init__(self, host: str, port: int, connect_timeout: float, request_timeout: float):
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def unreachable(self, path: str, exc: BaseException, waited: float | None) -> NameResolveError:
        if isinstance(exc, TimeoutError):
            reason = f"no answer within {waited:g}s"
        else:
            reason = str(exc) or type(exc).__name__
        return NameResolveError(
            f"etcd at {self.address} is unreachable ({path}: {reason}); start etcd there "
            f"(for tests: .ci/etcd.sh start) or point {_ADDR_FIELD} at a running etcd"
        )

    def open(
        self, path: str, body: dict, timeout: float | None
    ) -> tuple[socket.socket, http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send ``body``; return (socket, connection, response) with the status line read."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout)
        waited: float | None = self.connect_timeout
        try:
            conn.connect()
            sock = conn.sock
            sock.settimeout(timeout)
            waited = timeout
            conn.request(
                "POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"}
            )
            return sock, conn, conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise self.unreachable(path, exc, waited) from None

    def call(self, path: str, body: dict) -> dict:
        _sock, conn, resp = self.open(path, body, self.request_timeout)
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise self.unreachable(path, exc, self.request_timeout) from None
        finally:
            conn.close()
        return self.decode(path, resp.status, raw)

    def decode(self, path: str, status: int, raw: bytes) -> dict:
        try:
            payload: Any = json.loads(raw) if raw else {}
        except ValueError:
            payload = None
        if status == 200 and isinstance(payload, dict) and "error" not in payload:
            return payload
        if isinstance(payload, dict) and ("message" in payload or "error" in payload):
            detail = payload.get("message") or payload.get("error")
            code = payload.get("code")
        else:
            detail = raw[:200].decode(errors="replace").strip() or f"HTTP {status}"
            code = None
        hint = "" if code is not None else " (is this the client port of an etcd >= 3.4?)"
        raise EtcdRequestError(
            f"etcd at {self.address} refused {path}: {detail}{hint}", code=code, status=status
        )


class EtcdNameResolve(NameResolve):
    """Name-resolve in etcd v3 under ``<root>/``; see the module docstring."""

    def __init__(
        self,
        address: str,
        root: str = DEFAULT_ROOT,
        ttl: float = DEFAULT_TTL,
        connect_timeout: float = 2.0,
        request_timeout: float = 5.0,
    ):
        host, port = parse_address(address)
        try:
            check_key(root)
        except ConfigError:
            raise ConfigError(
                "EtcdNameResolve root", root, "use a key like 'corral' or 'a/b'"
            ) from None
        if not ttl > 0:
            raise ConfigError("EtcdNameResolve ttl", ttl, "use a positive number of seconds")
        self._gw = _Gateway(host, port, connect_timeout, request_timeout)
        self._root = root
        self._ttl = max(1, math.ceil(ttl))
        self._lock = threading.Lock()
        self._lease: int | None = None
        self._lease_ttl = self._ttl
        # Entries this process added: re-added on a fresh lease if etcd lost ours.
        self._owned: dict[str, str] = {}
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"EtcdNameResolve({self._gw.address!r}, root={self._root!r})"

    @property
    def address(self) -> str:
        return self._gw.address

    # -- keys -----------------------------------------------------------------------------------

    def _full(self, key: str) -> bytes:
        check_key(key)
        return f"{self._root}{KEY_SEP}{key}".encode()

    def _short(self, b64key: str) -> str:
        return _unb64(b64key)[len(self._root) + 1 :]

    def _below(self, prefix: str) -> dict:
        """The etcd range of every key strictly below ``prefix``."""
        start = self._full(prefix) + KEY_SEP.encode()
        end = start[:-1] + bytes([start[-1] + 1])
        return {"key": _b64(start), "range_end": _b64(end)}

    # -- the contract ---------------------------------------------------------------------------

    def add(self, key: str, value: str, replace: bool = False) -> None:
        full = self._full(key)
        if self._closed:
            raise NameResolveError(f"{self!r} is closed; build a new one to add {key!r}")
        for attempt in (1, 2):
            lease = self._ensure_lease()
            try:
                if replace:
                    self._gw.call("/v3/kv/put", self._put(full, value, lease))
                    added = True
                else:
                    added = self._put_if_absent(full, value, lease)
                break
            except EtcdRequestError as exc:
                if attempt == 2 or not self._lease_missing(exc):
                    raise
                self._forget_lease(lease)
        if not added:
            raise NameResolveError(
                f"name-resolve key {key!r} already exists in etcd at {self.address}"
            )
        with self._lock:
            self._owned[key] = value

    def get(self, key: str) -> str | None:
        return self._get(self._full(key))[0]

    def get_subtree(self, prefix: str) -> dict[str, str]:
        reply = self._gw.call("/v3/kv/range", self._below(prefix))
        return {self._short(kv["key"]): _unb64(kv.get("value", "")) for kv in reply.get("kvs", [])}

    def get_all(self) -> dict[str, str]:
        start = f"{self._root}{KEY_SEP}".encode()
        end = start[:-1] + bytes([start[-1] + 1])
        reply = self._gw.call("/v3/kv/range", {"key": _b64(start), "range_end": _b64(end)})
        return {self._short(kv["key"]): _unb64(kv.get("value", "")) for kv in reply.get("kvs", [])}

    def delete(self, key: str) -> None:
        self._gw.call("/v3/kv/deleterange", {"key": _b64(self._full(key))})
        with self._lock:
            self._owned.pop(key, None)

    def clear_subtree(self, prefix: str) -> None:
        exact = {"key": _b64(self._full(prefix))}
        ops = [{"request_delete_range": exact}, {"request_delete_range": self._below(prefix)}]
        self._gw.call("/v3/kv/txn", {"success": ops})
        head = prefix + KEY_SEP
        with self._lock:
            for key in [k for k in self._owned if k == prefix or k.startswith(head)]:
                del self._owned[key]

    def wait(self, key: str, timeout: float | None = None, poll_interval: float = 0.01) -> str:
        """Block until ``key`` exists, using an etcd watch (polling if watches do not work)."""
        full = self._full(key)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            value, revision = self._get(full)
            if value is not None:
                return value
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"name-resolve key {key!r} did not appear within {timeout}s")
            started = time.monotonic()
            try:
                value = self._watch_put(full, revision + 1, deadline)
            except _WatchUnavailable as exc:
                logger.debug("etcd watch unavailable (%s); polling for %r", exc, key)
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                return super().wait(key, remaining, poll_interval)
            if value is not None:
                return value
            if time.monotonic() - started < 0.05:  # the stream ended at once: do not spin
                time.sleep(0.05)

    def close(self) -> None:
        """Stop the keep-alive and revoke the lease, which deletes this process's entries."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(timeout=self._gw.request_timeout + self._gw.connect_timeout)
        with self._lock:
            lease, self._lease = self._lease, None
            self._owned.clear()
        if lease is not None:
            try:
                self._gw.call("/v3/lease/revoke", {"ID": str(lease)})
            except NameResolveError as exc:
                logger.warning("could not revoke etcd lease (entries expire in its TTL): %s", exc)

    def describe(self) -> dict:
        desc = {"type": "etcd3", "address": self.address}
        if self._root != DEFAULT_ROOT:
            desc["root"] = self._root
        return desc

    # -- etcd requests --------------------------------------------------------------------------

    def _get(self, full: bytes) -> tuple[str | None, int]:
        """The value of a full key (or None) and the store revision it was read at."""
        reply = self._gw.call("/v3/kv/range", {"key": _b64(full)})
        revision = int(reply.get("header", {}).get("revision", 0))
        kvs = reply.get("kvs") or []
        return (_unb64(kvs[0].get("value", "")) if kvs else None), revision

    @staticmethod
    def _put(full: bytes, value: str, lease: int) -> dict:
        return {"key": _b64(full), "value": _b64(value), "lease": str(lease)}

    def _put_if_absent(self, full: bytes, value: str, lease: int) -> bool:
        absent = {"key": _b64(full), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        body = {"compare": [absent], "success": [{"request_put": self._put(full, value, lease)}]}
        return bool(self._gw.call("/v3/kv/txn", body).get("succeeded"))

    def _watch_put(self, full: bytes, start_revision: int, deadline: float | None) -> str | None:
        """The value of the first put to ``full`` from ``start_revision`` on, or None when the
        watch slice ended first (the caller re-reads the key and watches again)."""
        slice_end = time.monotonic() + _WATCH_SLICE
        if deadline is not None:
            slice_end = min(slice_end, deadline)
        create = {"key": _b64(full), "start_revision": str(start_revision), "filters": ["NODELETE"]}
        sock, conn, resp = self._gw.open("/v3/watch", {"create_request": create}, _WATCH_SLICE)
        try:
            if resp.status != 200:
                raise _WatchUnavailable(f"HTTP {resp.status}")
            while True:
                left = slice_end - time.monotonic()
                if left <= 0:
                    return None
                sock.settimeout(left)
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException):  # TimeoutError is an OSError
                    return None
                if not line.strip():
                    if not line:
                        return None  # etcd closed the stream (e.g. it is shutting down)
                    continue
                try:
                    message = json.loads(line)
                except ValueError as exc:
                    raise _WatchUnavailable(f"unreadable watch message {line[:100]!r}") from exc
                if "error" in message:
                    raise _WatchUnavailable(str(message["error"]))
                result = message.get("result", {})
                if result.get("canceled") or result.get("compact_revision"):
                    return None
                for event in result.get("events", []):
                    if event.get("type", "PUT") == "PUT":
                        return _unb64(event.get("kv", {}).get("value", ""))
        finally:
            conn.close()
            resp.close()

    # -- the lease ------------------------------------------------------------------------------

    @staticmethod
    def _lease_missing(exc: EtcdRequestError) -> bool:
        return exc.code == _GRPC_NOT_FOUND and "lease not found" in str(exc)

    def _ensure_lease(self) -> int:
        with self._lock:
            if self._lease is None:
                reply = self._gw.call("/v3/lease/grant", {"TTL": str(self._ttl)})
                self._lease = int(reply["ID"])
                self._lease_ttl = int(reply.get("TTL", self._ttl))
            if self._keeper is None:
                self._keeper = threading.Thread(
                    target=self._keep_alive, name=f"etcd-keepalive-{self.address}", daemon=True
                )
                self._keeper.start()
            return self._lease

    def _forget_lease(self, lease: int) -> None:
        with self._lock:
            if self._lease == lease:
                self._lease = None

    def _keep_alive(self) -> None:
        """Refresh the lease every TTL/3; re-add our entries on a new lease if it was lost."""
        failing = False
        while True:
            interval = self._lease_ttl / 3
            if self._stop.wait(min(1.0, interval) if failing else interval):
                return
            with self._lock:
                lease = self._lease
            try:
                if lease is None:
                    self._readd_owned()
                else:
                    reply = self._gw.call("/v3/lease/keepalive", {"ID": str(lease)})
                    if int(reply.get("result", {}).get("TTL", 0)) <= 0:
                        logger.warning("etcd at %s lost our lease; re-adding entries", self.address)
                        self._forget_lease(lease)
                        self._readd_owned()
                if failing:
                    logger.info("etcd at %s reachable again", self.address)
                failing = False
            except NameResolveError as exc:
                if not failing:
                    logger.warning("etcd keep-alive failed (will retry): %s", exc)
                failing = True
            except Exception:  # never let the keep-alive die: entries would expire silently
                logger.exception("etcd keep-alive hit an unexpected error (will retry)")
                failing = True

    def _readd_owned(self) -> None:
        with self._lock:
            owned = dict(self._owned)
        if not owned or self._stop.is_set():
            return
        lease = self._ensure_lease()
        for key, value in owned.items():
            if not self._put_if_absent(self._full(key), value, lease):
                logger.warning("name-resolve key %r was taken by another process", key)
                with self._lock:
                    if self._owned.get(key) == value:
                        del self._owned[key]
