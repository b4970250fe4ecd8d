"""Every answer's `code` is snake_case, whatever the upstream put there.

An upstream's code that is a number (`"500"`, `503`), free text or absent reaches the client as
`upstream_http_<status>`, with the upstream's own code kept in the message; a snake_case one, or one that
differs from snake_case only in case and separators, is relayed (as snake_case). The gateway under uvicorn,
the upstream a loopback server, clients over real sockets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream, reply

CONFIG = """
retries: {{attempts: 1}}
providers:
  up: {{kind: openai, api_key: k, base_url: "{url}/v1", models: [davinci-002]}}
"""


@pytest.fixture
def gw(tmp_path: Path, upstream: Upstream) -> Iterator[GatewayThread]:
    with serve_config(tmp_path, CONFIG.format(url=upstream.url)) as g:
        yield g


def _body(code: Any) -> bytes:
    # No `type`: the OpenAI adapter reads a missing code from it.
    return json.dumps({"error": {"message": "it broke", "param": None, "code": code}}).encode()


@pytest.mark.parametrize(
    ("status", "code", "want", "message"),
    [
        (500, "500", "upstream_http_500", "it broke (upstream code 500)"),
        (503, 503, "upstream_http_503", "it broke (upstream code 503)"),
        (500, None, "upstream_http_500", "it broke"),
        (500, "Internal Error!", "upstream_http_500", "it broke (upstream code Internal Error!)"),
        (429, "RESOURCE_EXHAUSTED", "resource_exhausted", "it broke"),
        (500, "server_error", "server_error", "it broke"),
    ],
)
def test_an_upstream_code_reaches_the_client_in_snake_case(
    gw: GatewayThread, upstream: Upstream, status: int, code: Any, want: str, message: str
) -> None:
    upstream.handler = reply(_body(code), status=status)
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        resp = c.post("/v1/completions", json={"model": "up/davinci-002", "prompt": "x"})
    error = resp.json()["error"]
    assert error["code"] == want
    assert error["message"].endswith(message)
