"""The status page's spend-per-day chart, in a real headless Chromium (tests/helpers/chromium.py), over a
SQLite ledger whose rollups hold spend on several of the last 30 days, a day before them and a day with
none in between."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import pytest

from gateway.limits.usage import day_of
from tests.helpers.chromium import CDP, CHROMIUM, chromium
from tests.helpers.clients import body, client
from tests.helpers.servers import GatewayThread
from tests.helpers.sqlite import opened

from .conftest import ADMIN_KEY, ENV, SOLO_KEY, config

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")

# Days ago -> (requests, picodollars): nothing 2 days ago, the dearest day 29 days ago (the chart's first),
# and day 30, one before the 30 the chart shows.
SPEND: Final = {
    0: (1, 17 * 10**9),
    1: (4, 2 * 10**12),
    3: (2, 500 * 10**9),
    29: (3, 3_250_000 * 10**6),
    30: (9, 9 * 10**12),
}


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[CDP]:
    async with chromium(tmp_path) as cdp:
        yield cdp


def plant(db: Path, now: float) -> None:
    """Rollups as the writer leaves them, split over two keys and two models per day (the chart sums them)."""
    with opened(db) as conn:
        for ago, (requests, pico) in SPEND.items():
            day = day_of(now - ago * 86_400)
            half = requests // 2
            for key, model, share, part in (
                ("alice", "fast", half, pico * half // requests),
                ("solo", "demo/long", requests - half, pico - pico * half // requests),
            ):
                conn.execute(
                    "INSERT INTO daily (day, key_name, team, model, target, requests, errors, prompt_tokens, "
                    "completion_tokens, cost_pico) VALUES (?, ?, '', ?, 'demo/long', ?, 0, 0, 0, ?)",
                    (day, key, model, share, part),
                )


BARS: Final = """[...document.querySelectorAll('#spend-chart rect.bar')].map((r) => ({
    day: r.dataset.day, cost: Number(r.dataset.cost), requests: Number(r.dataset.requests),
    height: Number(r.getAttribute('height')), bottom: Number(r.getAttribute('y')) + Number(r.getAttribute('height')),
    box: r.getBoundingClientRect().height, title: r.querySelector('title').textContent}))"""


async def test_the_chart_draws_each_of_the_last_30_days_at_its_spend(tmp_path: Path, page: CDP) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{tmp_path / 'ledger.db'}"))
    now = time.time()
    window = [day_of(now - ago * 86_400) for ago in range(29, -1, -1)]
    with GatewayThread(path, ENV) as gw:  # it migrates the file before serving
        plant(tmp_path / "ledger.db", now)
        await page.open(gw.url + "/")
        await page.eval(f"sessionStorage.setItem('gateway.adminKey', {ADMIN_KEY!r})")
        await page.reload()
        await page.until("document.getElementById('spend-section').hidden", lambda v: v is False)
        bars = await page.until(BARS, lambda v: isinstance(v, list) and len(v) == 30)

        spend = {day_of(now - ago * 86_400): (n, pico / 10**12) for ago, (n, pico) in SPEND.items() if ago < 30}
        assert [b["day"] for b in bars] == window  # oldest first, every day, day 30 ago left out
        assert [(b["requests"], b["cost"]) for b in bars] == [spend.get(d, (0, 0.0)) for d in window]
        tallest = max(b["height"] for b in bars)
        assert tallest > 100  # the dearest day fills the plot (viewBox units)
        for b in bars:
            # Heights in proportion to the day's cost, all on one baseline; a day with nothing is flat.
            assert b["height"] == pytest.approx(tallest * b["cost"] / 3.25, abs=0.01), b
            assert b["bottom"] == pytest.approx(bars[0]["bottom"], abs=0.01)
        assert bars[window.index(day_of(now - 29 * 86_400))]["height"] == pytest.approx(tallest, abs=0.01)
        assert bars[-3]["height"] == 0 and bars[-2]["cost"] == 2.0 and bars[-1]["cost"] == 0.017
        assert bars[-2]["box"] > 0 and bars[-2]["box"] == pytest.approx(bars[0]["box"] * 2 / 3.25, rel=0.02)
        assert bars[-2]["title"] == f"{window[-2]}: $2, 4 requests"
        assert await page.eval("document.getElementById('spend-top').textContent") == "$3.25"
        table = await page.eval(
            "[...document.querySelectorAll('#spend tbody tr')].map(r => [...r.cells].map(c => c.innerText.trim()))"
        )
        assert table == [
            [window[0], "3", "$3.25"],
            [window[-4], "2", "$0.5"],
            [window[-2], "4", "$2"],
            [window[-1], "1", "$0.017"],
        ]

        # Live: a request served now grows today's bar on a later 2-second poll.
        with client(gw.url, SOLO_KEY) as c:
            assert c.post("/v1/completions", json=body()).status_code == 200
        today = await page.until(f"({BARS}).at(-1)", lambda v: isinstance(v, dict) and v["requests"] == 2, timeout=8)
        assert today["cost"] == pytest.approx(0.034) and today["height"] > 0

        shot = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        (tmp_path / "status-spend.png").write_bytes(base64.b64decode(shot["data"]))
