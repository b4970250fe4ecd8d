"""The gateway answers the same under gateway.server's protocol as under uvicorn's httptools one.

Each request goes over a raw socket to both; status, headers (but `date` and the request id) and body
(but the ids and timestamps the gateway draws per request) must match, the order of headers included.
The framing may differ: an answer the app sends in one body message without a content-length is chunked
by httptools, and given a content-length by ours (the client reads the same bytes either way).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.rawhttp import Client, Response, post
from tests.helpers.servers import GatewayThread

KEY = "gk-same-answers-5c1e"
CONFIG = """
server: {host: 127.0.0.1, port: 0}
keys: [{name: k, key: "gk-same-answers-5c1e"}]
providers:
  demo: {kind: fake, models: [echo, text]}
models:
  - name: fast
    targets: [{model: demo/text}]
"""
AUTH = f"authorization: Bearer {KEY}\r\n"


def _post(path: str, body: bytes, extra: str = AUTH) -> bytes:
    return post(path, body, extra)


def _get(path: str, method: str = "GET", extra: str = AUTH) -> bytes:
    return f"{method} {path} HTTP/1.1\r\nhost: t\r\n{extra}\r\n".encode()


REQUESTS: dict[str, tuple[bytes, str]] = {
    "completion": (_post("/v1/completions", b'{"model": "fast", "prompt": "hi", "max_tokens": 4}'), "POST"),
    "chat": (
        _post("/v1/chat/completions", b'{"model": "fast", "messages": [{"role": "user", "content": "x"}]}'),
        "POST",
    ),
    "stream": (_post("/v1/completions", b'{"model": "fast", "prompt": "hi", "max_tokens": 4, "stream": true}'), "POST"),
    "bad json": (_post("/v1/completions", b'{"model": '), "POST"),
    "no key": (_post("/v1/completions", b'{"model": "fast", "prompt": "hi"}', extra=""), "POST"),
    "unknown model": (_post("/v1/completions", b'{"model": "nope", "prompt": "hi"}'), "POST"),
    "wrong method": (_get("/v1/completions"), "GET"),
    "models": (_get("/v1/models"), "GET"),
    "health": (_get("/health"), "GET"),
    "ready": (_get("/ready"), "GET"),
    "not found": (_get("/no/such/route"), "GET"),
    "head": (_get("/health", "HEAD"), "HEAD"),
    "status page": (_get("/"), "GET"),
}
# Drawn per request: ids, timestamps, durations.
_VOLATILE = re.compile(rb'"(id|created|request_id)":\s*("[^"]*"|[0-9.]+)|(cmpl|chatcmpl|req)-[A-Za-z0-9_-]+')
_SKIP = {"date", "x-request-id", "content-length", "transfer-encoding"}


def _normal(response: Response) -> tuple[int, list[tuple[str, str]], bytes]:
    headers = [(k, v) for k, v in response.headers if k not in _SKIP]
    return response.status, headers, _VOLATILE.sub(b"<v>", response.body)


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayThread, GatewayThread]]:
    path: Path = tmp_path_factory.mktemp("same") / "gw.yaml"
    path.write_text(CONFIG)
    with GatewayThread(path, {}) as ours, GatewayThread(path, {}, http="httptools") as theirs:
        yield ours, theirs


@pytest.mark.parametrize("name", list(REQUESTS))
def test_the_same_request_gets_the_same_answer(name: str, gateways: tuple[GatewayThread, GatewayThread]) -> None:
    request, method = REQUESTS[name]
    answers = []
    for gateway in gateways:
        client = Client(gateway.port)
        try:
            client.send(request)
            answers.append(_normal(client.response(method)))
        finally:
            client.close()
    ours, theirs = answers
    assert ours == theirs
    assert ours[0] != 0
