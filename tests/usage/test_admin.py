"""The admin endpoints: their key (401 without or with a wrong one, 404 when none is configured), the
values of /admin/usage and /admin/status after a known sequence of requests, and the usage metrics.

Served by the real gateway (uvicorn in a thread), with a real redis-server and without Redis.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.clients import body, client
from tests.helpers.servers import GatewayThread

from .conftest import ADMIN_KEY, COST, ENV, FREE_KEY, TEAM_KEY, config, usage, wait_requests

NOT_FOUND = {"error": {"message": "Not Found", "type": "not_found_error", "param": None, "code": "not_found"}}


@pytest.fixture(params=["memory", "redis"])
def gw(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GatewayThread]:
    url = request.getfixturevalue("rds").url if request.param == "redis" else ""
    path = tmp_path / "config.yaml"
    path.write_text(config(url))
    with GatewayThread(path, ENV) as g:
        yield g


def known_sequence(url: str) -> None:
    """team: 2 x demo/long ($0.017 each) + 1 x fast (alias of demo/long, streamed); free: 1 x demo/text
    (priced by the `demo/*` glob at $100/1M both ways), 1 failing request (not booked)."""
    with client(url, TEAM_KEY) as c:
        for _ in range(2):
            assert c.post("/v1/completions", json=body()).status_code == 200
        with c.stream("POST", "/v1/completions", json=body(model="fast", max_tokens=5, stream=True)) as resp:
            assert resp.status_code == 200
            resp.read()
    with client(url, FREE_KEY) as c:
        resp = c.post("/v1/completions", json=body(model="demo/text", max_tokens=4))
        assert resp.status_code == 200
        assert resp.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        assert c.post("/v1/completions", json=body(model="flaky")).status_code == 502
    wait_requests(url, "team", 3)
    wait_requests(url, "free", 1)


def test_admin_routes_need_the_admin_key(gw: GatewayThread) -> None:
    for path in ("/admin/usage", "/admin/status"):
        with client(gw.url) as c:
            missing = c.get(path)
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == "missing_api_key"
        assert missing.json()["error"]["type"] == "authentication_error"
        for wrong in (TEAM_KEY, ADMIN_KEY + "x", ADMIN_KEY[:-1]):
            with client(gw.url, wrong) as c:
                resp = c.get(path)
            assert resp.status_code == 401
            assert resp.json()["error"]["code"] == "invalid_api_key"
            assert ADMIN_KEY not in resp.text
        with client(gw.url, ADMIN_KEY) as c:
            assert c.get(path).status_code == 200
        with httpx.Client(base_url=gw.url, trust_env=False, headers={"x-api-key": ADMIN_KEY}) as c:
            resp = c.get(path)
        assert resp.status_code == 200
        assert resp.headers["cache-control"] == "no-store"
    with client(gw.url, ADMIN_KEY) as c:
        bad = c.get("/admin/usage", params={"day": "2024-02-30"})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "day"
    assert bad.json()["error"]["code"] == "invalid_value"


@pytest.mark.parametrize("admin", ["", 'admin: {key: "${USAGE_UNSET_ADMIN_KEY}"}', 'admin: {key: ""}'])
def test_admin_routes_are_absent_without_an_admin_key(admin: str, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(re.sub(r"admin: .*\n", admin + "\n", config()))
    with GatewayThread(path, ENV) as gw:
        for key in (None, ADMIN_KEY, "", TEAM_KEY):
            with client(gw.url, key) as c:
                for route in ("/admin/usage", "/admin/status"):
                    resp = c.get(route)
                    assert resp.status_code == 404, (route, key)
                    assert resp.json() == NOT_FOUND
            with client(gw.url, key) as c:
                assert c.get("/no-such-route").json() == NOT_FOUND  # indistinguishable from an unknown route


def test_usage_values_after_a_known_sequence(gw: GatewayThread) -> None:
    known_sequence(gw.url)
    data = usage(gw.url)
    assert data["day"] == dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    assert data["keys"] == {
        "team": {
            "requests": 3,
            "prompt_tokens": 9,
            "completion_tokens": 19,
            "cost": 0.047,
            "cached": 0,
            "budget": 0.05,
            "by_model": {
                "demo/long": {"requests": 2, "prompt_tokens": 6, "completion_tokens": 14, "cost": 0.034, "cached": 0},
                "fast": {"requests": 1, "prompt_tokens": 3, "completion_tokens": 5, "cost": 0.013, "cached": 0},
            },
        },
        "free": {
            "requests": 1,
            "prompt_tokens": 3,
            "completion_tokens": 4,
            "cost": 0.0007,
            "cached": 0,
            "budget": None,
            "by_model": {
                "demo/text": {"requests": 1, "prompt_tokens": 3, "completion_tokens": 4, "cost": 0.0007, "cached": 0}
            },
        },
    }
    # Another day: every configured key, all zero.
    empty = usage(gw.url, "2001-01-01")
    assert empty["day"] == "2001-01-01"
    assert {k: (v["requests"], v["cost"], v["by_model"]) for k, v in empty["keys"].items()} == {
        "team": (0, 0.0, {}),
        "free": (0, 0.0, {}),
    }


def _status(url: str) -> dict[str, Any]:
    with client(url, ADMIN_KEY) as c:
        resp = c.get("/admin/status")
    assert resp.status_code == 200
    data: dict[str, Any] = resp.json()
    return data


def test_status_after_a_known_sequence(gw: GatewayThread) -> None:
    known_sequence(gw.url)
    s = _status(gw.url)
    assert s["redis"] == ("ok" if gw.pipeline.shared.configured else "disabled")
    assert s["providers"] == [
        {"name": "demo", "kind": "fake", "available": True, "reason": None, "models": ["long", "text"]},
        {
            "name": "openai",
            "kind": "openai",
            "available": False,
            "reason": "Provider 'openai' is unavailable: environment variable USAGE_UNSET_OPENAI_KEY is not set",
            "models": [],
        },
    ]
    assert s["aliases"] == [
        {
            "name": "fast",
            "strategy": "weighted",
            "targets": [{"model": "demo/long", "weight": 1.0}],
            "fallbacks": [],
            "context_window_fallbacks": [],
        },
        {
            "name": "flaky",
            "strategy": "ordered",
            "targets": [{"model": "demo/error-503", "weight": 1.0}],
            "fallbacks": [],
            "context_window_fallbacks": [],
        },
    ]
    targets = {t["target"]: t for t in s["targets"]}
    assert list(targets) == ["demo/long", "demo/error-503", "demo/text"]
    failing = targets["demo/error-503"]
    assert (failing["state"], failing["cause"], failing["failures"]) == ("cooling", "error", 1)
    assert 25_000 < failing["cooling_ms"] <= 30_000  # cooldown.base_ms
    assert targets["demo/long"]["state"] == "ok"
    assert targets["demo/long"]["inflight"] == 0
    # The team key's buckets: tpd 1000 charged 10 + 10 + 8 tokens (a day drips back 1 token per 86.4 s).
    limits = {(b["scope"], b["kind"]): b for b in s["limits"]}
    assert limits[("key:team", "tpd")]["remaining"] == 1000 - 28
    assert limits[("key:team", "tpd")]["limit"] == 1000
    assert 28 * 86_400 - 5_000 < limits[("key:team", "tpd")]["reset_ms"] <= 28 * 86_400
    assert limits[("key:team", "concurrent")]["remaining"] == 4
    assert s["usage"] == usage(gw.url)


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([^{ ]+)(?:\{(.*)\})? (\S+)$", line)
        if m is None or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def test_metrics_after_a_known_sequence(gw: GatewayThread) -> None:
    known_sequence(gw.url)
    with client(gw.url) as c:
        text = c.get("/metrics").text
    assert metric(text, "gateway_cost_usd_total", model="demo/long", key="team") == pytest.approx(2 * COST)
    assert metric(text, "gateway_cost_usd_total", model="fast", key="team") == pytest.approx(0.013)
    assert metric(text, "gateway_cost_usd_total", model="demo/text", key="free") == pytest.approx(0.0007)
    assert metric(text, "gateway_cost_usd_total") == pytest.approx(0.0477)
    # Streams count their tokens too (the usage in their last event).
    assert metric(text, "gateway_tokens_total", kind="prompt", model="fast") == 3
    assert metric(text, "gateway_tokens_total", kind="completion", model="fast") == 5
    assert metric(text, "gateway_tokens_total", kind="completion", model="demo/long") == 14
    assert metric(text, "gateway_tokens_total", kind="prompt") == 12
    assert metric(text, "gateway_tokens_total", kind="completion") == 23
