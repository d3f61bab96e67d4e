"""Headless Chromium driven over the DevTools protocol, with the standard library only.

``Browser`` starts ``chromium --headless --remote-debugging-pipe`` (the protocol's JSON messages,
NUL-terminated, on file descriptors 3 and 4: no port, no websocket), opens one page and records
what a user's console would show as an error: uncaught exceptions, ``console.error`` calls and
the browser's own error log entries (a failed resource load, a refused navigation). scripts/setup.sh
installs chromium (Debian's package) when run as root; ``chromium_or_skip_reason`` says why a
test cannot run without it.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    env = os.environ.get("DLMPIPE_CHROMIUM")
    if env:
        return shutil.which(env) or (env if os.access(env, os.X_OK) else None)
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


def chromium_or_skip_reason() -> tuple[str | None, str]:
    """(the chromium binary, "") or (None, why a browser test cannot run here)."""
    binary = find_chromium()
    if binary is None:
        return None, ("chromium is not installed (scripts/setup.sh installs Debian's `chromium` "
                      "with apt-get when run as root: `sudo apt-get install chromium`)")
    return binary, ""


class BrowserError(RuntimeError):
    pass


class _NoMessage(BrowserError):
    """Nothing from chromium before the deadline."""


class Browser:
    """One headless Chromium with one page (``with Browser() as b: b.navigate(url) ...``)."""

    def __init__(self, binary: str | None = None, width: int = 1400, height: int = 1000,
                 timeout: float = 60.0):
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise BrowserError(chromium_or_skip_reason()[1])
        self.width, self.height, self.timeout = width, height, timeout
        self.errors: list[str] = []  # what the console shows as errors, in order
        self.contexts: dict[str, int] = {}  # frame id -> its main world's execution context
        self._events: list[dict] = []
        self._buffer = b""
        self._next_id = 0

    # ---- process and protocol -------------------------------------------------------------
    def __enter__(self) -> "Browser":
        self._profile = tempfile.mkdtemp(prefix="dlmpipe-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # the protocol pipe is fds 3 (commands in) and 4 (replies out) of the browser
        args = [self.binary, "--headless", "--remote-debugging-pipe", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
                f"--user-data-dir={self._profile}", f"--window-size={self.width},{self.height}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to run its sandbox as root
        args.append("about:blank")

        def child_fds():  # in the child, before exec (and before it closes the other fds)
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)]
            for target, fd in zip((3, 4), high):
                os.dup2(fd, target)

        self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, pass_fds=(3, 4),
                                         preexec_fn=child_fds)
        os.close(to_browser_r)
        os.close(from_browser_w)
        try:
            target = self.send("Target.createTarget", url="about:blank")["targetId"]
            self._session = self.send("Target.attachToTarget", targetId=target,
                                      flatten=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self.page(f"{domain}.enable")
            self.page("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                      deviceScaleFactor=1, mobile=False)
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._process.poll() is None:
                try:
                    self.send("Browser.close", timeout=5)
                except Exception:
                    pass
                try:
                    self._process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
        finally:
            for fd in (self._to_browser, self._from_browser):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(self._profile, ignore_errors=True)

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _NoMessage("chromium did not answer in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError(f"chromium exited (status {self._process.poll()})")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _record(self, event: dict) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            self.errors.append(f"uncaught exception: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.errors.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            self.errors.append(f"{entry['source']}: {entry['text']} {entry.get('url', '')}".strip())
        elif method == "Runtime.executionContextCreated":
            context = params["context"]
            aux = context.get("auxData", {})
            if aux.get("isDefault") and aux.get("frameId"):
                self.contexts[aux["frameId"]] = context["id"]
        elif method == "Runtime.executionContextsCleared":
            self.contexts.clear()
        self._events.append(event)

    def send(self, method: str, session: str | None = None, timeout: float | None = None,
             **params) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._record(reply)

    def page(self, method: str, **params) -> dict:
        return self.send(method, session=self._session, **params)

    def pump(self, seconds: float) -> None:
        """Let the page run for ``seconds``, recording its events."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                self._record(self._read(deadline))
            except _NoMessage:
                return

    # ---- what a test does -----------------------------------------------------------------
    def navigate(self, url: str) -> None:
        self._events.clear()
        self.page("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str, frame: str | None = None):
        """The JSON value of ``expression`` in the page (or in the frame with that id)."""
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        if frame is not None:
            params["contextId"] = self.contexts[frame]
        result = self.page("Runtime.evaluate", **params)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"{expression!r} threw: "
                               f"{details.get('exception', {}).get('description') or details['text']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, frame: str | None = None, timeout: float | None = None):
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            try:
                value = self.evaluate(expression, frame)
            except (BrowserError, KeyError):
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                seen = "".join(f"\n  {e}" for e in self.errors) or " none"
                raise BrowserError(f"timed out waiting for {expression!r}; console errors:{seen}")
            self.pump(0.05)

    def frames(self) -> list[dict]:
        """Every frame below the page's main frame: [{'id', 'url'}] (an iframe's url: its src)."""
        out = []

        def walk(node):
            for child in node.get("childFrames", []):
                out.append({"id": child["frame"]["id"], "url": child["frame"].get("url", "")})
                walk(child)

        walk(self.page("Page.getFrameTree")["frameTree"])
        return out

    def screenshot(self, path: str | Path) -> Path:
        data = self.page("Page.captureScreenshot", format="png")["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path
