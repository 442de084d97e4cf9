"""A headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: commands
on fd 3, replies and events on fd 4, each a JSON message ended by a NUL byte), for the report's browser
test. No dependency: the pipe needs no websocket client, and the test uses six protocol methods
(Target.createTarget/attachToTarget, the Runtime/Log/Network/Page domains, Page.captureScreenshot).

Used as ``with Browser(path) as b: page = b.open(url)``; ``page`` says what the page logged, what it
requested, and holds a full-page PNG screenshot.
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

#: Debian's package names of the browser, and other common names
CANDIDATES = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome", "google-chrome-stable")
HANG = 600  # seconds before a reply counts as never coming (liveness only, never a speed check)


def find_chromium() -> str | None:
    """The path of a Chromium on PATH (``$CHROMIUM`` first), or ``None``."""
    for name in ((os.environ.get("CHROMIUM"),) if os.environ.get("CHROMIUM") else ()) + CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    for path in ("/usr/lib/chromium/chromium-headless-shell", "/usr/lib/chromium/chromium"):
        if os.access(path, os.X_OK):
            return path
    return None


@dataclass
class Page:
    """What a page did while loading: ``console`` (``(level, text)`` of console calls, log entries and
    uncaught exceptions), ``requests`` (URLs other than the page's own and its inline ``data:``), ``png`` (a full-page screenshot),
    ``values`` (the results of the expressions asked for)."""

    console: list = field(default_factory=list)
    requests: list = field(default_factory=list)
    png: bytes = b""
    values: dict = field(default_factory=dict)

    def errors(self) -> list:
        return [(level, text) for level, text in self.console if level in ("error", "assert")]


class Browser:
    def __init__(self, path: str):
        self.path = path
        self._id = 0
        self._buf = b""
        self._events: list = []

    def __enter__(self) -> "Browser":
        self._dir = tempfile.mkdtemp(prefix="dynlab-chromium-")
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()

        def fds():  # in the child: the protocol's fds 3 (commands in) and 4 (replies out)
            a, b = os.dup(cmd_r), os.dup(res_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [self.path, "--headless", "--remote-debugging-pipe", f"--user-data-dir={self._dir}",
                "--disable-gpu", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--hide-scrollbars", "--mute-audio", "about:blank"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox (CI runs as root)
        self.proc = subprocess.Popen(args, preexec_fn=fds, pass_fds=(3, 4), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(cmd_r)
        os.close(res_w)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # this process, by its id
            self.proc.wait()
        for fd in (self._cmd_w, self._res_r):
            os.close(fd)
        shutil.rmtree(self._dir, ignore_errors=True)

    def _read(self) -> dict:
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._res_r], [], [], HANG)
            if not ready:
                raise TimeoutError(f"no DevTools message in {HANG} s")
            chunk = os.read(self._res_r, 1 << 20)
            if not chunk:
                raise EOFError("Chromium closed its DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and return its result, keeping the events that arrive meanwhile."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self._events.append(reply)

    def _wait_for(self, method: str, session: str) -> None:
        deadline = time.monotonic() + HANG
        while not any(e.get("method") == method and e.get("sessionId") == session for e in self._events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} in {HANG} s")
            self._events.append(self._read())

    def open(self, url: str, width: int = 1200, evaluate: dict | None = None) -> Page:
        """Load ``url`` in a new tab, wait for its load event, and return what it did (:class:`Page`)."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable", session=session)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session)
        self._events.clear()
        self.call("Page.navigate", {"url": url}, session)
        self._wait_for("Page.loadEventFired", session)
        page = Page()
        for name, expr in (evaluate or {}).items():
            page.values[name] = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                                          session)["result"].get("value")
        size = self.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
        shot = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
            "x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}}, session)
        page.png = base64.b64decode(shot["data"])
        for e in self._events:
            if e.get("sessionId") != session:
                continue
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled":
                page.console.append((p["type"], " ".join(str(a.get("value", a.get("description", "")))
                                                         for a in p.get("args", []))))
            elif e["method"] == "Runtime.exceptionThrown":
                page.console.append(("error", p["exceptionDetails"].get("text", "exception")))
            elif e["method"] == "Log.entryAdded":
                page.console.append((p["entry"]["level"], p["entry"]["text"]))
            elif e["method"] == "Network.requestWillBeSent" and p["request"]["url"] != url \
                    and not p["request"]["url"].startswith("data:"):  # data: URLs are the page's own bytes
                page.requests.append(p["request"]["url"])
        self.call("Target.closeTarget", {"targetId": target})
        return page
