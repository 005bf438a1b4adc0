"""Headless Chromium driven over the DevTools protocol, for pages that render with JavaScript over a
websocket (a Bokeh server page: ``--dump-dom`` with a virtual-time budget prints it before BokehJS has
its document). The protocol client is tornado's websocket client (a dependency of distributed): no new
package. Debian's ``/usr/bin/chromium`` (``scripts/setup.sh`` installs it).

Example
-------
>>> with Chromium() as browser:  # doctest: +SKIP
...     browser.open("http://127.0.0.1:8787/status")
...     browser.wait_for("document.querySelectorAll('.bk-Figure').length > 0")
...     png = browser.screenshot()
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

from polling import wait_until
from tornado.websocket import websocket_connect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
)


async def _connect(url: str):
    return await websocket_connect(url, max_message_size=256 << 20)  # screenshots come base64-encoded


async def _close(ws) -> None:
    ws.close()
    await asyncio.sleep(0)


class Chromium:
    """One headless Chromium with a fresh profile, its first tab driven over the DevTools protocol.
    ``errors``: console errors and uncaught exceptions of the pages opened."""

    def __init__(self, width: int = 1400, height: int = 1000, timeout: float = 60.0):
        self.timeout, self.errors, self._n = timeout, [], 0
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            port_file = os.path.join(self.profile, "DevToolsActivePort")
            wait_until(lambda: os.path.exists(port_file) and os.path.getsize(port_file), timeout, "chromium's port")
            with open(port_file) as f:
                port = int(f.readline())
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as r:
                page = next(t for t in json.load(r) if t["type"] == "page")
            self.loop = asyncio.new_event_loop()
            self.ws = self.loop.run_until_complete(_connect(page["webSocketDebuggerUrl"]))
            self.call("Runtime.enable")
            self.call("Page.bringToFront")
            self.call("Emulation.setFocusEmulationEnabled", enabled=True)
            self.call(
                "Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False
            )
        except BaseException:
            self.close()
            raise

    def call(self, method: str, **params) -> dict:
        """One DevTools command; its result (events read meanwhile: errors kept)."""
        return self.loop.run_until_complete(asyncio.wait_for(self._call(method, params), self.timeout))

    async def _call(self, method: str, params: dict) -> dict:
        self._n += 1
        await self.ws.write_message(json.dumps({"id": self._n, "method": method, "params": params}))
        while True:
            message = await self.ws.read_message()
            if message is None:
                raise RuntimeError(f"chromium closed the DevTools connection during {method}")
            reply = json.loads(message)
            if reply.get("id") == self._n:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._event(reply)

    def _event(self, event: dict) -> None:
        params = event.get("params", {})
        if event.get("method") == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append(f"uncaught: {details.get('exception', {}).get('description') or details.get('text')}")
        elif event.get("method") == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(
                "console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
            )

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float | None = None, what: str | None = None):
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while not (value := self.evaluate(expression)):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what or expression} not true after {timeout or self.timeout} s")
            time.sleep(0.2)
        return value

    def screenshot(self) -> bytes:
        return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            self.loop.run_until_complete(_close(ws))  # tornado makes its close frame's Future on the running loop
        if getattr(self, "loop", None) is not None:
            self.loop.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
