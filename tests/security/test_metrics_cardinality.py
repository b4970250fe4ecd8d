"""Item 8 of issue 11: clients must not choose metric series or usage rows.

Every test drives a real gateway (uvicorn on a loopback socket) with hundreds of random model names
and then reads `/metrics`, `/admin/usage` and (with Redis) the usage hashes themselves. Before the fix
each name became its own series and its own usage row: 5,000 names made a 5 MB `/metrics`.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from aiohttp import web

from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream

ADMIN = "adm-card-3f9a1c"
N = 500

CONFIG = """
redis: {{url: "{redis}"}}
admin: {{key: "${{CARD_ADMIN_KEY}}"}}
retries: {{attempts: 1}}
logging: {{requests: false}}
cooldown: {{base_ms: 60000, max_ms: 60000, min_requests: 1}}  # every failure cools: one series each
prices:
  "demo/*": {{prompt_per_1m: 1, completion_per_1m: 1}}
providers:
  demo:
    kind: fake
    models: [text, long]
  up:
    kind: vllm
    base_url: "{upstream}/v1"
    models: [served]
models:
  - {{name: fast, targets: [{{model: demo/text}}]}}
"""


def _samples(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def _label_values(text: str, label: str) -> set[str]:
    return set(re.findall(rf'\b{label}="([^"]*)"', text))


def _random_model(prefix: str) -> str:
    return f"{prefix}/{secrets.token_hex(6)}"


def _failing(request: web.Request, received: Received) -> Any:
    async def handler() -> web.StreamResponse:
        return web.json_response({"error": {"message": "overloaded", "type": "server_error"}}, status=503)

    return handler()


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as up:
        yield up


def _serve(tmp_path: Path, upstream: Upstream, redis_url: str = "") -> Any:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(redis=redis_url, upstream=upstream.url))
    return GatewayThread(path, {"CARD_ADMIN_KEY": ADMIN})


def _flood(gw: GatewayThread, models: list[str], **extra: Any) -> list[int]:
    """POST one small completion per model over one keep-alive connection; the statuses."""
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=15) as c:
        return [
            c.post("/v1/completions", json={"model": m, "prompt": "a b", "max_tokens": 2, **extra}).status_code
            for m in models
        ]


def _usage(gw: GatewayThread) -> dict[str, Any]:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=15) as c:
        resp = c.get("/admin/usage", headers={"authorization": f"Bearer {ADMIN}"})
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def _wait_booked(gw: GatewayThread, requests: int) -> dict[str, Any]:
    done = threading.Event()
    for _ in range(200):
        data = _usage(gw)
        if data["keys"].get("anonymous", {}).get("requests", 0) >= requests:
            return data
        done.wait(0.025)
    raise AssertionError(f"fewer than {requests} requests booked: {data}")


def _metrics(gw: GatewayThread) -> str:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=15) as c:
        resp = c.get("/metrics")
    assert resp.status_code == 200
    return resp.text


def test_random_model_names_leave_metrics_and_usage_bounded(tmp_path: Path, upstream: Upstream) -> None:
    with _serve(tmp_path, upstream) as gw:
        # The declared model, an alias and an unknown vendor first: what an operator must still see exactly.
        assert _flood(gw, ["demo/text"] * 3 + ["fast"] * 2 + ["nope/x"]) == [200] * 5 + [404]
        baseline = _metrics(gw)
        statuses = _flood(gw, [_random_model("demo") for _ in range(N)])
        assert statuses == [200] * N
        text = _metrics(gw)
        usage = _wait_booked(gw, N + 5)

    # The series a flood of names can add is a constant, not one (or more) per name.
    assert len(_samples(text)) <= len(_samples(baseline)) + 40, len(_samples(text))
    assert len(text) < 64 * 1024, len(text)
    models = _label_values(text, "model")
    assert models <= {"demo/text", "fast", "demo/other", "unknown"}, sorted(models)[:10]
    assert (
        'gateway_requests_total{dialect="openai",endpoint="completions",'
        'model="demo/other",provider="demo",status="200"} 500.0'
    ) in text
    # Declared models and aliases are still counted exactly.
    assert (
        'gateway_requests_total{dialect="openai",endpoint="completions",'
        'model="demo/text",provider="demo",status="200"} 3.0'
    ) in text
    assert (
        'gateway_requests_total{dialect="openai",endpoint="completions",model="fast",provider="demo",status="200"} 2.0'
    ) in text

    by_model = usage["keys"]["anonymous"]["by_model"]
    assert set(by_model) == {"demo/text", "fast", "demo/other"}, sorted(by_model)[:10]
    assert by_model["demo/other"]["requests"] == N
    assert by_model["demo/text"]["requests"] == 3 and by_model["fast"]["requests"] == 2
    # The price of each request is still its own model's: 2 prompt + 2 completion tokens at $1/1M each.
    assert by_model["demo/other"]["cost"] == pytest.approx(N * 4e-6)


def test_random_model_names_leave_redis_usage_rows_bounded(tmp_path: Path, upstream: Upstream) -> None:
    rds = RedisServer()
    try:
        with _serve(tmp_path, upstream, rds.url) as gw:
            assert _flood(gw, [_random_model("demo") for _ in range(N)]) == [200] * N
            usage = _wait_booked(gw, N)
        with redis.Redis(port=rds.port) as r:
            hashes = [k for k in r.keys("usage:*") if r.type(k) == b"hash"]
            assert len(hashes) == 1, hashes
            fields = r.hkeys(hashes[0])
    finally:
        rds.stop()
    # One row (four counters) for the bucket plus the day total, whatever the number of names.
    assert len(fields) <= 5, sorted(fields)[:10]
    assert set(usage["keys"]["anonymous"]["by_model"]) == {"demo/other"}


def test_random_failing_targets_leave_cooldown_series_bounded(tmp_path: Path, upstream: Upstream) -> None:
    upstream.handler = _failing
    try:
        with _serve(tmp_path, upstream) as gw:
            statuses = _flood(gw, [_random_model("up") for _ in range(200)] + ["up/served"])
            text = _metrics(gw)
    finally:
        upstream.reset()
    assert set(statuses) == {502}
    targets = _label_values(text, "target")
    assert targets <= {"up/other", "up/served"}, sorted(targets)[:10]
    assert 'gateway_cooldowns_total{cause="error",target="up/other"} 200.0' in text
    assert len(_label_values(text, "model")) <= 3


def test_labels_follow_the_reloaded_config(tmp_path: Path, upstream: Upstream) -> None:
    with _serve(tmp_path, upstream) as gw:
        assert _flood(gw, ["demo/echo"]) == [200]
        path = tmp_path / "config.yaml"
        path.write_text(path.read_text().replace("models: [text, long]", "models: [text, long, echo]"))
        before = gw.app.state.reloader.reloads
        for _ in range(400):
            if gw.app.state.reloader.reloads > before:
                break
            threading.Event().wait(0.025)
        assert gw.app.state.reloader.reloads > before, "the config was not reloaded"
        assert _flood(gw, ["demo/echo"]) == [200]
        text = _metrics(gw)
    assert (
        'gateway_requests_total{dialect="openai",endpoint="completions",'
        'model="demo/other",provider="demo",status="200"} 1.0'
    ) in text
    assert (
        'gateway_requests_total{dialect="openai",endpoint="completions",'
        'model="demo/echo",provider="demo",status="200"} 1.0'
    ) in text
