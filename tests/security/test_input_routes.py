"""Every route that takes a client body decodes it through the same checks, and authenticates first.

`/tokenize`, `/detokenize` and the model-scoped `/m/<model>/v1/completions` over real sockets (uvicorn in
a thread, a loopback vLLM-like upstream that must never be called): invalid UTF-8 and JSON nested past
the interpreter's recursion limit are a 400 in OpenAI's error shape naming the field, as on
`/v1/completions`, never a 500; and a caller without a valid key gets the 401 before any of its body is
decoded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream

KEY = "k-routes-5d1e"
SCOPED = "/m/vl/m1/v1/completions"
BAD_UTF8 = {
    "/tokenize": (b'{"model": "vl/m1", "prompt": "caf\xe9 \xff"}', "prompt"),
    "/detokenize": (b'{"model": "vl/m1\xff", "tokens": [1, 2]}', "model"),
    SCOPED: (b'{"prompt": "caf\xe9 \xff", "max_tokens": 2}', "prompt"),
}
DEEP = b'{"prompt": "hi", "response_format": {"a": ' + b"[" * 5000 + b"]" * 5000 + b"}}"


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def gw(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    config = f"keys:\n  - {{name: t, key: {KEY}}}\nproviders:\n  vl: {{kind: vllm, base_url: {upstream.url}/v1}}\n"
    with serve_config(Path(tmp_path_factory.mktemp("routes")), config) as server:
        yield server


def post(gw: GatewayThread, path: str, body: bytes, key: str | None = KEY) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(gw.url + path, content=body, headers=headers, trust_env=False, timeout=10)


def error(resp: httpx.Response) -> dict[str, object]:
    assert resp.headers["content-type"].startswith("application/json"), resp.text[:300]
    found = resp.json()["error"]
    assert isinstance(found, dict)
    return found


@pytest.mark.parametrize("path", list(BAD_UTF8))
def test_invalid_utf8_is_a_400_naming_the_field(gw: GatewayThread, upstream: Upstream, path: str) -> None:
    body, field = BAD_UTF8[path]
    resp = post(gw, path, body)
    assert resp.status_code == 400, resp.text[:300]
    err = error(resp)
    assert err["param"] == field and err["code"] == "invalid_utf8", err
    assert upstream.received == []


def test_deep_nesting_on_the_scoped_path_is_a_400(gw: GatewayThread, upstream: Upstream) -> None:
    resp = post(gw, SCOPED, DEEP)
    assert resp.status_code == 400, resp.text[:300]
    err = error(resp)
    assert err["param"] == "response_format" and err["code"] == "too_deeply_nested", err
    assert upstream.received == []


@pytest.mark.parametrize("key", [None, "k-wrong"])
@pytest.mark.parametrize(
    ("path", "body"),
    [*(pytest.param(p, b, id=f"{p}-utf8") for p, (b, _) in BAD_UTF8.items()), pytest.param(SCOPED, DEEP, id="deep")],
)
def test_an_unauthenticated_caller_gets_the_401_before_its_body_is_read(
    gw: GatewayThread, upstream: Upstream, path: str, body: bytes, key: str | None
) -> None:
    resp = post(gw, path, body, key)
    assert resp.status_code == 401, resp.text[:300]
    assert error(resp)["code"] in ("missing_api_key", "invalid_api_key")
    assert upstream.received == []
