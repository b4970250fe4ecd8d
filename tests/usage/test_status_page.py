"""The status page in a real headless Chromium, driven over the Chrome DevTools Protocol (aiohttp websocket).

The page is served by the real gateway on loopback (tests/helpers/chromium.py drives the browser). The
admin key never goes into a URL: the test enters it through the page's form (or sets the tab's
sessionStorage through CDP and reloads), and reads what the page rendered from live `/admin/status` data:
the providers, a target cooling after a failing request, rate-limit headroom and today's usage, which
changes on the next 2-second poll after another request. A wrong key shows the 401 state; a team admin's
key shows its team's part, the other panels hidden. A PNG screenshot is written to the test's tmp dir.
Skipped only when no Chromium binary is installed.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.helpers.chromium import CDP, CHROMIUM, chromium
from tests.helpers.clients import body, client
from tests.helpers.servers import GatewayThread

from .conftest import ADMIN_KEY, ENV, FREE_KEY, TEAM_KEY, config, wait_requests

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")

STORE = "gateway.adminKey"
# An alias whose name is markup: the page must show it as text, never parse it.
MARKUP_ALIAS = "<img src=x onerror=document.title='pwned'>"


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
    async with chromium(tmp_path) as cdp:
        yield cdp


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
    # No alias here balances by latency: the column is blank for every target, and the panel says why.
    assert {r[6] for r in rows} == {"\u2013"}
    note = await page.eval("document.getElementById('targets').parentElement.querySelector('p').innerText")
    assert "strategy: latency" in note and "least-busy" in note
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
    # No ledger: no spend-per-day chart (tests/ledger/test_status_chart.py draws one).
    assert await page.eval("document.getElementById('spend-section').hidden") is True
    assert await page.eval("document.querySelectorAll('#spend-chart').length") == 0
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


OPS_ADMIN = "adm-usage-ops-6d2b"


async def test_status_page_for_a_team_admin(tmp_path: Path, page: CDP) -> None:
    """A team's admin key opens the page on its team's part: the panels its view has no field for are hidden,
    the rest show its keys, buckets and reachable targets alone."""
    yaml = config().replace('key: "${USAGE_TEAM_KEY}",', 'key: "${USAGE_TEAM_KEY}", team: ops,')
    path = tmp_path / "config.yaml"
    path.write_text(yaml + 'teams: {ops: {admin_key: "${USAGE_OPS_ADMIN}", models: ["demo/*", flaky]}}\n')
    with GatewayThread(path, {**ENV, "USAGE_OPS_ADMIN": OPS_ADMIN}) as gw:
        with client(gw.url, FREE_KEY) as c:
            assert c.post("/v1/completions", json=body(model="fast")).status_code == 200
        wait_requests(gw.url, "free", 1)
        failing_and_served_requests(gw.url)
        await page.open(gw.url + "/")
        await page.eval(
            f"document.getElementById('key').value = {OPS_ADMIN!r}; "
            "document.getElementById('login-form').requestSubmit()"
        )
        await page.until(text("targets"), lambda v: isinstance(v, str) and "demo/error-503" in v)
        assert await page.eval(text("team")) == "team ops (its keys only)"
        for hidden in ("providers-section", "queues-section", "cache-section"):
            assert await page.eval(f"document.getElementById({hidden!r}).hidden") is True, hidden
        assert await page.eval("document.getElementById('aliases-section').hidden") is False
        aliases = await page.eval(text("aliases"))
        assert "flaky" in aliases and "fast" not in aliases
        rows = await page.eval(
            "[...document.querySelectorAll('#targets tbody tr')].map(r => [...r.cells].map(c => c.innerText))"
        )
        assert sorted(r[0] for r in rows) == ["demo/error-503", "demo/long", "demo/text"]
        failing = next(r for r in rows if r[0] == "demo/error-503")
        assert failing[1] == "cooling" and failing[3] == "error" and failing[5:] == ["\u2013", "\u2013"]
        assert "key:team" in await page.eval(text("limits"))
        usage = await page.eval(text("usage"))
        assert "team" in usage and "free" not in usage
        shot = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        (tmp_path / "status-page-team.png").write_bytes(base64.b64decode(shot["data"]))
