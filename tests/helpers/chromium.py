"""A real headless Chromium driven over the Chrome DevTools Protocol (an aiohttp websocket), for the pages
the gateway serves. `CHROMIUM` is None when no binary is installed (`.ci/run` installs Debian's `chromium`
when it runs as root); tests skip then."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


class CDP:
    """The smallest DevTools client: one page target, commands answered by id, events ignored."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), 15)
            if msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                result: dict[str, Any] = msg["result"]
                return result

    async def eval(self, expression: str, *, tolerate: bool = False) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if tolerate and "exceptionDetails" in result:
            return None  # e.g. the element is not there yet
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    async def until(self, expression: str, ok: Callable[[Any], bool], timeout: float = 10) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = await self.eval(expression, tolerate=True)
            if ok(value):
                return value
            assert time.monotonic() < deadline, f"{expression} never satisfied the check; last value: {value!r}"
            await asyncio.sleep(0.1)

    async def open(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        await self.until("document.readyState", lambda v: v == "complete")

    async def reload(self) -> None:
        """Reload and wait for the new document (the old one, marked, may still answer for a moment)."""
        await self.eval("window.__before_reload = true")
        await self.call("Page.reload")
        await self.until("!window.__before_reload && document.readyState", lambda v: v == "complete")


@contextlib.asynccontextmanager
async def chromium(tmp_path: Path) -> AsyncIterator[CDP]:
    """A headless Chromium with its own profile under `tmp_path`, and a DevTools client on its one page."""
    assert CHROMIUM is not None
    profile = tmp_path / "chromium-profile"
    log = (tmp_path / "chromium.log").open("wb")
    args = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--no-first-run",
        "--no-default-browser-check",
        "--no-proxy-server",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",  # Chromium picks a free port and writes it to DevToolsActivePort
        "about:blank",
    ]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 20
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, f"chromium exited with {proc.returncode}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession(trust_env=False) as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                targets = await resp.json()
            target = next(t for t in targets if t["type"] == "page")
            async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                yield CDP(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
