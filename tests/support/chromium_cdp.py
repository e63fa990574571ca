"""Drive Debian's headless Chromium over the DevTools protocol (no browser downloads).

Used by the report test to open report.html from disk and by the dashboard test to open
the live dashboard: collect console errors, check that every image decoded, evaluate
scripts in the page, and save a screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.local.processes import stop_process

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
]


@dataclass
class PageResult:
    """What loading one page produced."""

    console_errors: list[str] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)
    title: str = ""


class Chromium:
    """A headless Chromium process and one page session on it."""

    def __init__(self) -> None:
        if CHROMIUM is None:
            raise RuntimeError("chromium is not installed: apt-get install -y chromium")
        # Chromium helpers may still write into the profile while it stops: do not fail on that.
        self._profile = tempfile.TemporaryDirectory(
            prefix="kvscope-chromium-", ignore_cleanup_errors=True
        )
        self._process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._ids = itertools.count(1)
        self._events: list[dict[str, Any]] = []
        self._stack = contextlib.ExitStack()
        try:
            from websockets.sync.client import connect

            self._ws = self._stack.enter_context(
                connect(self._browser_url(), max_size=None, open_timeout=10)
            )
            target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self._call(
                "Target.attachToTarget", {"targetId": target, "flatten": True}
            )["sessionId"]
        except BaseException:
            self.close()  # never leave a browser behind when the connection fails
            raise

    def _browser_url(self) -> str:
        port_file = Path(self._profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if port_file.exists():
                lines = port_file.read_text().split()
                if len(lines) == 2:
                    return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
            if self._process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError("chromium did not open its DevTools port")

    def _call(
        self, method: str, params: dict[str, Any] | None = None, session: bool = False
    ) -> dict[str, Any]:
        message_id = next(self._ids)
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        self._ws.send(json.dumps(message))
        while True:
            reply = json.loads(self._ws.recv(timeout=30))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._events.append(reply)

    def _wait_event(self, method: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self._events):
            self._events.append(
                json.loads(self._ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            )

    def open(self, path: Path, width: int = 1280, height: int = 1600) -> PageResult:
        """Load a file, wait for the load event, and report errors and images."""
        return self.open_url(path.resolve().as_uri(), width, height)

    def open_url(self, url: str, width: int = 1280, height: int = 1600) -> PageResult:
        """Load a URL, wait for the load event, and report errors and images."""
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self._call(domain, session=True)
        self._call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=True,
        )
        self._events.clear()
        self._call("Page.navigate", {"url": url}, session=True)
        self._wait_event("Page.loadEventFired")
        images = self.evaluate(
            "JSON.stringify(Array.from(document.images).map(i => ({"
            "alt: i.alt, complete: i.complete, naturalWidth: i.naturalWidth})))"
        )
        return PageResult(
            self.console_errors(), json.loads(images), self.evaluate("document.title")
        )

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serializable values)."""
        reply = self._call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True
        )
        if "exceptionDetails" in reply:
            raise RuntimeError(f"page script failed: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def console_errors(self) -> list[str]:
        """Errors the page logged or threw since it was opened (events read so far)."""
        errors = []
        for event in self._events:
            params = event.get("params", {})
            if event.get("method") == "Runtime.exceptionThrown":
                errors.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") in (
                "error",
                "assert",
            ):
                errors.append(json.dumps(params.get("args", []))[:500])
            elif event.get("method") == "Log.entryAdded" and params["entry"]["level"] == "error":
                errors.append(params["entry"].get("text", "")[:500])
        return errors

    def screenshot(self, out: Path) -> Path:
        """Save a PNG of the current viewport."""
        data = self._call("Page.captureScreenshot", {"format": "png"}, session=True)["data"]
        out.write_bytes(base64.b64decode(data))
        return out

    def close(self) -> None:
        """Close the connection, stop the browser, delete its profile."""
        self._stack.close()
        stop_process(self._process, grace_s=5)
        self._profile.cleanup()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
