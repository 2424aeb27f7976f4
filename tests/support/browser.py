"""A headless Chromium driven over the DevTools protocol, for tests of the status pages.

Debian's ``chromium`` is started with a throw-away profile and ``--remote-debugging-port=0``
(the port it picks is read from ``DevToolsActivePort``); one page target is driven over a
websocket (wsproto over a plain socket, no other library). Everything the page does is
recorded: console messages, uncaught exceptions, log entries and every request's URL.

:func:`find_chromium` says why there is none, so a test can skip with the reason.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Ping, Request, TextMessage

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def find_chromium() -> tuple[str | None, str]:
    """The browser's path, or None and why."""
    for name in NAMES:
        if path := shutil.which(name):
            return path, ""
    return None, (
        "no headless Chromium on this machine (apt-get install chromium; .ci/run installs it)"
    )


# Flags that keep the browser to itself: no first-run pages, no component or safe-browsing
# updates, no sync, no crash reports.
QUIET = (
    "--headless=new",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-breakpad",
    "--metrics-recording-only",
    "--mute-audio",
    "--password-store=basic",
)


class Browser:
    """One headless Chromium and one of its pages."""

    def __init__(self, binary: str, profile: Path, *, width: int = 1200, height: int = 900):
        profile.mkdir(parents=True, exist_ok=True)
        argv = [binary, *QUIET, "--remote-debugging-port=0", f"--user-data-dir={profile}"]
        argv.append(f"--window-size={width},{height}")
        if os.geteuid() == 0:
            argv.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.proc = subprocess.Popen(
            [*argv, "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._buffer = ""
        try:
            port = self._port(profile / "DevToolsActivePort")
            with NO_PROXY.open(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
                targets = json.loads(answer.read())
            page = next(t for t in targets if t.get("type") == "page")
            self._connect(page["webSocketDebuggerUrl"])
            for domain in ("Runtime", "Log", "Network", "Page"):
                self.call(f"{domain}.enable")
        except BaseException:
            self.close()
            raise

    def _port(self, path: Path, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(path.read_text().splitlines()[0])
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited: {self.proc.stderr.read()[-2000:]!r}")
            time.sleep(0.1)
        raise RuntimeError("chromium did not open its DevTools port")

    def _connect(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock.sendall(self.ws.send(Request(host=parts.netloc, target=parts.path)))
        while not any(isinstance(e, AcceptConnection) for e in self._read()):
            pass

    def _read(self) -> list[Any]:
        data = self.sock.recv(1 << 20)
        if not data:
            raise RuntimeError("chromium closed the DevTools connection")
        self.ws.receive_data(data)
        events = list(self.ws.events())
        for e in events:
            if isinstance(e, Ping):
                self.sock.sendall(self.ws.send(e.response()))
        return events

    def _messages(self) -> list[dict[str, Any]]:
        out = []
        for e in self._read():
            if isinstance(e, CloseConnection):
                raise RuntimeError("chromium closed the DevTools connection")
            if isinstance(e, TextMessage):
                self._buffer += e.data
                if e.message_finished:
                    out.append(json.loads(self._buffer))
                    self._buffer = ""
        return out

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One DevTools command and its result; events meanwhile are recorded."""
        i = next(self._ids)
        message = json.dumps({"id": i, "method": method, "params": params or {}})
        self.sock.sendall(self.ws.send(TextMessage(data=message)))
        while True:
            for m in self._messages():
                if m.get("id") == i:
                    if "error" in m:
                        raise RuntimeError(f"{method}: {m['error']}")
                    return m.get("result", {})
                if "method" in m:
                    self.events.append(m)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def wait_for(self, expression: str, timeout: float, what: str = "") -> Any:
        """Poll an expression until it is truthy; its value. TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"not within {timeout:.0f} s: {what or expression}")
            time.sleep(0.25)

    def screenshot(self, path: Path) -> None:
        import base64

        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.write_bytes(base64.b64decode(data["data"]))

    # --- what the page did ---------------------------------------------------------------

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries (CSP violations, failed
        loads) so far."""
        out = []
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value")) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append("log: " + p["entry"].get("text", ""))
        return out

    def requests(self) -> list[str]:
        """Every URL the page requested so far."""
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e["method"] == "Network.requestWillBeSent"
        ]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.sock.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
