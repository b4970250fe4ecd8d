"""A stream the upstream breaks after its first event is booked as the failure it is.

The client saw `200` and the first events, then gets an error event and `[DONE]`; the request log line
carries the error's status, code and cause and names the target that broke, and the metrics count it
under `gateway_upstream_failures_total` (not as a `200`). The gateway under uvicorn, the upstream a
loopback server that resets the connection mid-stream, through both transports.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.accesslog import Lines
from tests.helpers.clients import sse_data
from tests.helpers.faults import FaultServer, cut
from tests.helpers.servers import GatewayThread

from .test_observability import metric

CONFIG = """
retries: {{attempts: 2, same_target: 0}}
providers:
  up: {{kind: openai, api_key: k, base_url: "{url}", transport: {transport}, models: [davinci-002]}}
"""


@pytest.fixture(params=["h1", "httpx"])
def gw(request: pytest.FixtureRequest, tmp_path: Path, faults: FaultServer) -> Iterator[GatewayThread]:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(url=faults["alpha"].base_url, transport=request.param))
    with GatewayThread(path, {}) as g:
        yield g


def test_a_stream_broken_after_its_first_event_is_logged_and_counted_as_a_failure(
    gw: GatewayThread, faults: FaultServer, access: Lines
) -> None:
    faults["alpha"].script(cut(2))
    body = {"model": "up/davinci-002", "prompt": "hello", "max_tokens": 16, "stream": True}
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=10) as c:
        resp = c.post("/v1/completions", json=body)
        text = c.get("/metrics").text
    assert resp.status_code == 200
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]" and len(data) == 4
    error = json.loads(data[-2])["error"]
    assert error["code"] == "upstream_truncated_response"
    [line] = [x for x in access.lines if x["request_id"] == resp.headers["x-request-id"]]
    assert (line["status"], line["error"], line["cause"], line["provider"], line["target"]) == (
        502,
        "upstream_truncated_response",
        "truncated_response",
        "up",
        "up/davinci-002",
    )
    assert metric(text, "gateway_upstream_failures_total", target="up/davinci-002", cause="truncated_response") == 1
    assert metric(text, "gateway_requests_total", provider="up", status="502") == 1
    assert metric(text, "gateway_requests_total", status="200") == 0
