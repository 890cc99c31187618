"""A real headless Chromium driven over the DevTools protocol (websocket-client).

Starts Debian's ``chromium`` with its own profile directory, talks to one page, and
stops the browser's process group (started by us, signalled by its id) on close.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-port=0",
    "--window-size=1280,900",
]


def chromium_path() -> str | None:
    return (
        os.environ.get("CORRAL_CHROMIUM")
        or shutil.which("chromium")
        or shutil.which("chromium-browser")
    )


class BrowserError(RuntimeError):
    pass


class Browser:
    def __init__(self, timeout: float = 30.0):
        import websocket  # websocket-client

        path = chromium_path()
        if path is None:
            raise BrowserError("chromium not found (apt-get install chromium)")
        self.profile = tempfile.mkdtemp(prefix="corral-chromium-")
        self.proc = subprocess.Popen(
            [path, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        endpoint = self._devtools_endpoint(timeout)
        port = re.search(r":(\d+)/", endpoint).group(1)
        deadline = time.monotonic() + timeout
        page = None
        while page is None and time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                page = next((t for t in json.load(r) if t.get("type") == "page"), None)
            if page is None:
                time.sleep(0.1)
        if page is None:
            raise BrowserError("chromium opened no page")
        self.ws = websocket.create_connection(
            page["webSocketDebuggerUrl"], timeout=timeout, suppress_origin=True
        )
        self._id = 0
        self.console: list[str] = []
        self.send("Page.enable")
        self.send("Runtime.enable")

    def _devtools_endpoint(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            found = re.search(r"DevTools listening on (ws://\S+)", line)
            if found:
                threading.Thread(target=self._drain, daemon=True).start()
                return found.group(1)
        self.close()
        raise BrowserError(f"chromium did not start: {''.join(seen)[-2000:]}")

    def _drain(self) -> None:
        """Keep reading chromium's stderr so a chatty browser never blocks on the pipe."""
        for _line in self.proc.stderr:
            pass

    def send(self, method: str, **params) -> dict:
        self._id += 1
        ident = self._id
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("method") == "Runtime.consoleAPICalled":
                args = msg["params"].get("args", [])
                self.console.append(" ".join(str(a.get("value", "")) for a in args))
            if msg.get("method") == "Runtime.exceptionThrown":
                details = msg["params"]["exceptionDetails"]
                self.console.append(
                    f"exception: {details.get('exception', {}).get('description', details)}"
                )
            if msg.get("id") == ident:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def eval(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, what: str = ""):
        """Poll ``expression`` in the page until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        value = None
        while time.monotonic() < deadline:
            try:
                value = self.eval(expression)
            except BrowserError:
                value = None
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(
            f"page never showed {what or expression} within {timeout}s; last value {value!r}; "
            f"console: {self.console[-5:]}; body: {self.eval('document.body.innerText')[:1500]!r}"
        )

    def screenshot(self, path: str, width: int = 1280, height: int = 900) -> None:
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(base64.b64decode(data))

    def close(self) -> None:
        try:
            if getattr(self, "ws", None) is not None:
                self.ws.close()
        except Exception:
            pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
