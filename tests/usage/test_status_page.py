"""The status page in a real headless Chromium, driven over the Chrome DevTools Protocol (aiohttp websocket).

The page is served by the real gateway on loopback. The admin key never goes into a URL: the test enters
it through the page's form (or sets the tab's sessionStorage through CDP and reloads), and reads what the page
rendered from live `/admin/status` data: the providers, a target cooling after a failing request, rate-limit
headroom and today's usage, which changes on the next 2-second poll after another request. A wrong key
shows the 401 state. A PNG screenshot is written to the test's tmp dir. Skipped only when no Chromium
binary is installed (`.ci/run` installs Debian's `chromium` when it runs as root).
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers.clients import body, client
from tests.helpers.servers import GatewayThread

from .conftest import ADMIN_KEY, ENV, FREE_KEY, TEAM_KEY, config, wait_requests

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")

STORE = "gateway.adminKey"
# An alias whose name is markup: the page must show it as text, never parse it.
MARKUP_ALIAS = "<img src=x onerror=document.title='pwned'>"


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


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[GatewayThread]:
    path = tmp_path / "config.yaml"
    extra = f'  - {{name: "{MARKUP_ALIAS}", targets: [{{model: demo/text}}]}}\n'
    extra += "  - {name: gpt, targets: [{model: openai/gpt-3.5-turbo-instruct}]}\n"  # its key variable is unset
    path.write_text(config() + extra)
    with GatewayThread(path, ENV) as g:
        yield g


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[CDP]:
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


def failing_and_served_requests(url: str) -> None:
    with client(url, TEAM_KEY) as c:
        assert c.post("/v1/completions", json=body()).status_code == 200
        assert c.post("/v1/completions", json=body(model="flaky")).status_code == 502  # cools demo/error-503
    wait_requests(url, "team", 1)


def text(section: str) -> str:
    return f"document.getElementById({section!r}).innerText"


async def test_status_page_renders_live_data(gw: GatewayThread, page: CDP, tmp_path: Path) -> None:
    failing_and_served_requests(gw.url)
    await page.open(gw.url + "/")
    # No key yet: the page asks for one and shows no data.
    assert await page.eval("document.getElementById('login').hidden") is False
    assert await page.eval("document.getElementById('panels').hidden") is True
    # The operator's way in: the form, which keeps the key in the tab's sessionStorage (and survives a reload).
    await page.eval(
        f"document.getElementById('key').value = {ADMIN_KEY!r}; document.getElementById('login-form').requestSubmit()"
    )
    await page.until(text("targets"), lambda v: isinstance(v, str) and "demo/error-503" in v)
    assert await page.eval(f"sessionStorage.getItem({STORE!r})") == ADMIN_KEY
    assert await page.eval("document.getElementById('key').value") == ""
    await page.reload()
    await page.until(text("targets"), lambda v: isinstance(v, str) and "demo/error-503" in v)

    providers = await page.eval(text("providers"))
    assert "demo" in providers and "fake" in providers and "available" in providers
    assert "USAGE_UNSET_OPENAI_KEY is not set" in providers  # the unavailable provider says why
    rows = await page.eval(
        "[...document.querySelectorAll('#targets tbody tr')].map(r => [...r.cells].map(c => c.innerText))"
    )
    failing = next(r for r in rows if r[0] == "demo/error-503")
    assert failing[1] == "cooling" and failing[3] == "error" and failing[4] == "1"
    assert failing[2].endswith(" s") and 20 < float(failing[2].split()[0]) <= 30  # cooldown left
    assert next(r for r in rows if r[0] == "demo/long")[1] == "ok"
    # A target nothing can call is not "ok": the page says so, and why.
    unset = next(r for r in rows if r[0] == "openai/gpt-3.5-turbo-instruct")
    assert unset[1] == "unavailable" and "USAGE_UNSET_OPENAI_KEY is not set" in unset[3]
    limits = await page.eval(text("limits"))
    assert "key:team" in limits and "tpd 1,000" in limits and "990" in limits
    usage = await page.eval(
        "[...document.querySelectorAll('#usage tbody tr')].map(r => [...r.cells].map(c => c.innerText.trim()))"
    )
    team = next(r for r in usage if r[0] == "team")
    assert team[1:5] == ["1", "3", "7", "$0.017"] and "$0.017 of $0.05" in team[5]
    assert MARKUP_ALIAS in await page.eval(text("aliases"))
    assert await page.eval("document.querySelectorAll('#aliases img').length") == 0  # shown as text, not markup
    assert await page.eval("document.title") == "Gateway status"
    assert ADMIN_KEY not in await page.eval("location.href")

    # Live: another request shows up on the next 2-second poll.
    with client(gw.url, FREE_KEY) as c:
        assert c.post("/v1/completions", json=body(model="demo/text", max_tokens=4)).status_code == 200
    await page.until(text("usage"), lambda v: "free" in v and "$0.0007" in v, timeout=6)

    shot = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    png = base64.b64decode(shot["data"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    (tmp_path / "status-page.png").write_bytes(png)


async def test_status_page_shows_401_for_a_wrong_key(gw: GatewayThread, page: CDP, tmp_path: Path) -> None:
    await page.open(gw.url + "/")
    await page.eval(f"sessionStorage.setItem({STORE!r}, 'not-the-admin-key')")
    await page.reload()
    banner = await page.until(text("banner"), lambda v: isinstance(v, str) and "401" in v)
    assert "admin key was refused" in banner
    assert await page.eval("document.getElementById('banner').hidden") is False
    assert await page.eval("document.getElementById('panels').hidden") is True
    assert await page.eval("document.getElementById('login').hidden") is False
    assert await page.eval(f"sessionStorage.getItem({STORE!r})") is None  # the refused key is forgotten
    assert "demo/error-503" not in await page.eval("document.body.innerText")
    shot = await page.call("Page.captureScreenshot", format="png")
    (tmp_path / "status-page-401.png").write_bytes(base64.b64decode(shot["data"]))
