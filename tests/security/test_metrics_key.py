"""`/metrics` behind `metrics.key` (issue 11, item 8): what a scrape reveals (models, keys' names and
spend, traffic) is for the operator, not for every client that can reach the gateway's port.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import GatewayThread

KEY = "mk-7c2e0d51a9"
CONFIG = """
logging: {requests: false}
metrics: {key: "${CARD_METRICS_KEY}"}
providers:
  demo: {kind: fake, models: [text]}
"""


def _serve(tmp_path: Path, config: str, env: dict[str, str]) -> Iterator[GatewayThread]:
    path = tmp_path / "config.yaml"
    path.write_text(config)
    with GatewayThread(path, env) as gw:
        yield gw


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[GatewayThread]:
    yield from _serve(tmp_path, CONFIG, {"CARD_METRICS_KEY": KEY})


def _get(gw: GatewayThread, headers: dict[str, str] | None = None) -> httpx.Response:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        assert c.post("/v1/completions", json={"model": "demo/text", "prompt": "x"}).status_code == 200
        return c.get("/metrics", headers=headers or {})


def test_metrics_with_a_key_refuses_without_it(gw: GatewayThread) -> None:
    for headers in (
        None,
        {"authorization": "Bearer wrong-key"},
        {"authorization": f"Bearer {KEY}x"},
        {"authorization": KEY},  # not a Bearer credential
        {"authorization": f"Basic {KEY}"},
        {"x-api-key": KEY},  # the client-key header is not the scraper's
    ):
        resp = _get(gw, headers)
        assert resp.status_code == 401, (headers, resp.status_code)
        assert resp.headers["www-authenticate"] == "Bearer"
        assert resp.headers["content-type"].startswith("application/json")
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert "gateway_requests_total" not in resp.text and KEY not in resp.text


def test_metrics_with_a_key_answers_with_it(gw: GatewayThread) -> None:
    resp = _get(gw, {"authorization": f"Bearer {KEY}"})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    assert (
        'gateway_requests_total{dialect="openai",endpoint="completions",'
        'model="demo/text",provider="demo",status="200"} 1.0'
    ) in resp.text


def test_metrics_without_a_key_stay_open(tmp_path: Path) -> None:
    for gw in _serve(tmp_path, CONFIG.replace('metrics: {key: "${CARD_METRICS_KEY}"}\n', ""), {}):
        assert _get(gw).status_code == 200


def test_metrics_key_whose_variable_is_unset_stays_closed(tmp_path: Path) -> None:
    # A missing secret must not open what the operator meant to close.
    for gw in _serve(tmp_path, CONFIG, {}):
        assert _get(gw).status_code == 401
        assert _get(gw, {"authorization": "Bearer x"}).status_code == 401
