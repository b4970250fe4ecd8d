"""Issue 13, item 2: one request-body limit and one error renderer for every route.

`gateway.edge.app.Front` enforces `caps.request_body_bytes` (64 KiB in this suite's config) before any route
runs, so the raw routes (completions in four dialects, the model-scoped base path, vLLM's tokenizer
routes), the Litestar routes and unknown paths all answer an oversized body with the same 413, in the
path's dialect. And an error raised by a Litestar route is rendered by the same function as one raised
on a completion route (gateway/edge/render.py): same status, body and headers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar import Request, post

from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Recorder

from .conftest import FULL_KEY, INPUT_CONFIG, LIMITED_KEY, SGP_ACCOUNT

LIMIT = 65536
MESSAGE = f"The request body is larger than {LIMIT} bytes"
OPENAI_413 = {
    "error": {"message": MESSAGE, "type": "invalid_request_error", "param": None, "code": "request_too_large"}
}
FASTAPI_413 = {"detail": MESSAGE}

# Every family of route: the raw completion endpoints per dialect, the model-scoped base path, the
# tokenizer routes (bare and scoped), the Litestar routes (GET-only ones included), and no route at all.
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", OPENAI_413),
    ("/inference/v1/completions", OPENAI_413),
    ("/v4/beta/completions", FASTAPI_413),
    ("/api/v1/compatibility/openai/v1/completions", FASTAPI_413),
    ("/m/up/davinci-002/v1/completions", OPENAI_413),
    ("/tokenize", OPENAI_413),
    ("/detokenize", OPENAI_413),
    ("/m/up/davinci-002/tokenize", OPENAI_413),
    ("/v1/models", OPENAI_413),
    ("/admin/usage", OPENAI_413),
    ("/health", OPENAI_413),
    ("/metrics", OPENAI_413),
    ("/no/such/route", OPENAI_413),
]
# The routes that read a body: one sent without a declared length is counted as it arrives.
READING = [r for r in ROUTES if not r[0].startswith(("/v1/models", "/admin", "/health", "/metrics", "/no/"))]
# What the server or the transport adds, not the renderer.
TRANSPORT = {"date", "server", "content-length", "transfer-encoding", "connection", "keep-alive", "x-request-id"}


def _rendered(resp: httpx.Response) -> tuple[int, dict[str, str], Any]:
    headers = {k: v for k, v in resp.headers.items() if k not in TRANSPORT}
    return resp.status_code, headers, resp.json()


def _assert_413(resp: httpx.Response, expected: dict[str, Any]) -> None:
    assert resp.status_code == 413, resp.text
    assert resp.json() == expected
    assert resp.headers["content-type"] == "application/json"
    assert resp.headers["x-should-retry"] == "false"


@pytest.mark.parametrize(("route", "expected"), ROUTES, ids=[r for r, _ in ROUTES])
def test_a_declared_oversized_body_is_the_same_413_on_every_route(
    client: httpx.Client, up: Recorder, route: str, expected: dict[str, Any]
) -> None:
    resp = client.post(
        route,
        content=b"{" + b" " * LIMIT + b"}",
        headers={"authorization": f"Bearer {FULL_KEY}", "content-type": "application/json", "x-request-id": "big-1"},
    )
    _assert_413(resp, expected)
    assert resp.headers["x-request-id"] == "big-1"
    assert up.received == []


@pytest.mark.parametrize(("route", "expected"), READING, ids=[r for r, _ in READING])
def test_a_chunked_oversized_body_is_the_same_413(
    client: httpx.Client, up: Recorder, route: str, expected: dict[str, Any]
) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "up/davinci-002", "prompt": "'
        for _ in range(LIMIT // 4096 + 1):
            yield b"x" * 4096
        yield b'"}'

    resp = client.post(
        route, content=chunks(), headers={"authorization": f"Bearer {FULL_KEY}", "content-type": "application/json"}
    )
    assert "content-length" not in resp.request.headers  # sent chunked: nothing declared
    _assert_413(resp, expected)
    assert up.received == []


def test_a_body_at_the_limit_passes_the_front(client: httpx.Client, up: Recorder) -> None:
    # Exactly the limit, declared: not "larger than" the limit, so the route serves it.
    body = b'{"model": "up/davinci-002", "prompt": "hi"' + b" " * (LIMIT - 43) + b"}"
    assert len(body) == LIMIT
    resp = client.post(
        "/v1/completions",
        content=body,
        headers={"authorization": f"Bearer {FULL_KEY}", "content-type": "application/json"},
    )
    assert resp.status_code == 200, resp.text


def test_a_litestar_route_and_a_completion_route_render_errors_alike(client: httpx.Client, up: Recorder) -> None:
    """The same 401 (no key) from GET /v1/models (Litestar) and POST /v1/completions (raw ASGI)."""
    listing = client.get("/v1/models")
    completion = client.post("/v1/completions", json={"model": "up/davinci-002", "prompt": "hi"})
    assert listing.status_code == 401
    assert _rendered(listing) == _rendered(completion)
    assert set(_rendered(listing)[1]) == {"content-type", "x-should-retry"}


def test_not_found_from_litestar_and_from_the_scoped_router_render_alike(client: httpx.Client) -> None:
    """An unknown path (Litestar's 404) and an unknown suffix under /m/ (the raw router's 404)."""
    litestar = client.get("/no/such/route")
    scoped = client.get("/m/up/davinci-002/no-such-suffix")
    assert litestar.status_code == 404
    assert _rendered(litestar) == _rendered(scoped)
    assert litestar.json()["error"]["type"] == "not_found_error"


@post("/test/echo-length", status_code=200)
async def _echo_length(request: Request[Any, Any, Any]) -> dict[str, int]:
    return {"length": len(await request.body())}


def test_a_litestar_route_that_reads_a_chunked_body_gets_the_same_413(upstream: Recorder, tmp_path: Path) -> None:
    """No Litestar route of the gateway reads a body today; one registered here shows that the limit (raised
    from `Front`'s receive inside Litestar) is rendered by the one renderer, not as a 500."""
    config = tmp_path / "config.yaml"
    config.write_text(INPUT_CONFIG.format(u=upstream.url, full=FULL_KEY, limited=LIMITED_KEY, account=SGP_ACCOUNT))
    gw = GatewayThread(config, {})
    gw.app.litestar.register(_echo_length)
    gw.start()
    try:
        with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
            small = c.post("/test/echo-length", content=iter([b"x" * 1000, b"y" * 1000]))
            assert small.json() == {"length": 2000}
            big = c.post("/test/echo-length", content=iter([b"x" * 40_000, b"y" * 40_000]))
            assert "content-length" not in big.request.headers
            _assert_413(big, OPENAI_413)
            declared = c.post("/test/echo-length", content=b"x" * (LIMIT + 1))
            _assert_413(declared, OPENAI_413)
    finally:
        gw.stop()
