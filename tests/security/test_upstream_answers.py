"""Items 6 and 10 of issue 11: an upstream answer that is not an answer is a failed attempt.

A `200` carrying an error envelope (or a completion without `choices`), and a stream whose first event
is an error envelope or cannot be read, used to reach the client as a successful empty completion or a
500 with no failover. Each case runs over real sockets: the gateway served by uvicorn
(`tests.helpers.servers.GatewayThread`), two scripted loopback upstreams (`tests.helpers.faults`), the
official `openai` SDK or raw HTTP as the client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.clients import sse_data
from tests.helpers.faults import (
    CHUNKS,
    OVERLOADED_BODY,
    QUOTA_BODY,
    RATE_LIMIT_BODY,
    RECORDED_400,
    RECORDED_COMPLETION,
    RECORDED_STREAM_TEXT,
    Behaviour,
    FaultServer,
    openai_error,
    respond,
    stream,
)
from tests.helpers.servers import GatewayThread, serve_config

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
# same_target 0: an envelope fails over like its status would (the default retries a 5xx on alpha first).
retries: {{attempts: 3, initial_backoff_ms: 1, max_backoff_ms: 2, budget_ms: 5000, same_target: 0}}
cooldown: {{base_ms: 50, max_ms: 100}}
timeouts: {{connect_ms: 2000, first_byte_ms: 5000, total_ms: 10000}}
providers:
  alpha: {{kind: openai, api_key: sk-alpha-upstream-key-0001, base_url: "{alpha}"}}
  beta: {{kind: openai, api_key: sk-beta-upstream-key-0002, base_url: "{beta}"}}
models:
  - name: pair
    strategy: ordered
    targets: [{{model: alpha/davinci-002}}, {{model: beta/davinci-002}}]
  - name: solo
    targets: [{{model: alpha/davinci-002}}]
"""


@pytest.fixture
def gateway(faults: FaultServer, tmp_path: Path) -> Iterator[GatewayThread]:
    with serve_config(tmp_path, CONFIG.format(alpha=faults["alpha"].base_url, beta=faults["beta"].base_url)) as gw:
        yield gw


def post(gw: GatewayThread, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(trust_env=False, timeout=20) as client:
        return client.post(gw.url + "/v1/completions", json=body)


def ok_200(body: bytes) -> Behaviour:
    return respond(body, 200)


def sse_error(body: bytes) -> Behaviour:
    """A `200` stream whose first event is this body (then [DONE])."""
    return stream([b"data: " + json.dumps(json.loads(body), separators=(",", ":")).encode()])


# --------------------------------------------------------------------------------------------------
# Item 6: a 200 that carries an error, or a completion without choices


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(OVERLOADED_BODY, id="openai-server-error-envelope"),
        pytest.param(
            b'{"object": "error", "message": "engine overloaded", "type": "InternalServerError", "code": 500}',
            id="vllm-object-error",
        ),
        pytest.param(b'{"error": "Model is overloaded", "error_type": "overloaded"}', id="tgi-string-error"),
        pytest.param(b'{"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}', id="no-choices"),
        pytest.param(b'{"id": "cmpl-1", "choices": []}', id="empty-choices"),
    ],
)
def test_200_error_envelope_fails_over_to_the_next_target(
    gateway: GatewayThread, faults: FaultServer, body: bytes
) -> None:
    faults["alpha"].script(ok_200(body))
    resp = post(gateway, {"model": "pair", "prompt": "x"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"] == RECORDED_COMPLETION["choices"][0]["text"]
    assert faults.order() == ["alpha", "beta"]
    assert resp.headers["x-gateway-provider"] == "beta"


def test_200_server_error_envelope_everywhere_is_a_retryable_502(gateway: GatewayThread, faults: FaultServer) -> None:
    faults["alpha"].script(then=ok_200(OVERLOADED_BODY))
    faults["beta"].script(then=ok_200(OVERLOADED_BODY))
    resp = post(gateway, {"model": "pair", "prompt": "x"})
    assert resp.status_code == 502, resp.text
    err = resp.json()["error"]
    assert err["type"] == "upstream_error"
    assert "overloaded" in err["message"]
    assert resp.headers["x-gateway-attempts"] == "3"  # retried: every attempt was used


def test_200_rate_limit_envelope_is_a_retried_429(gateway: GatewayThread, faults: FaultServer) -> None:
    faults["alpha"].script(then=ok_200(RATE_LIMIT_BODY))
    resp = post(gateway, {"model": "solo", "prompt": "x"})
    assert resp.status_code == 429, resp.text
    assert resp.json()["error"]["type"] == "rate_limit_error"
    assert resp.json()["error"]["code"] == "rate_limit_exceeded"
    assert faults["alpha"].count == 3


def test_200_quota_envelope_is_a_quota_429_never_retried_on_the_same_target(
    gateway: GatewayThread, faults: FaultServer
) -> None:
    faults["alpha"].script(then=ok_200(QUOTA_BODY))
    resp = post(gateway, {"model": "solo", "prompt": "x"})
    assert resp.status_code == 429, resp.text
    assert resp.json()["error"]["code"] == "insufficient_quota"
    assert faults["alpha"].count == 1


def test_200_quota_envelope_moves_on_to_another_target(gateway: GatewayThread, faults: FaultServer) -> None:
    faults["alpha"].script(then=ok_200(QUOTA_BODY))
    resp = post(gateway, {"model": "pair", "prompt": "x"})
    assert resp.status_code == 200, resp.text
    assert faults.order() == ["alpha", "beta"]


def test_200_invalid_request_envelope_is_the_clients_400_not_retried(
    gateway: GatewayThread, faults: FaultServer
) -> None:
    # The recorded envelope with OpenAI's documented invalid_value code (model_not_found means a 404, below).
    invalid = openai_error("Invalid value for 'temperature'", "invalid_request_error", "invalid_value", "temperature")
    faults["alpha"].script(then=ok_200(invalid))
    resp = post(gateway, {"model": "pair", "prompt": "x"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["type"] == "invalid_request_error"
    assert faults.order() == ["alpha"]


def test_200_model_not_found_envelope_is_a_404_that_moves_on(gateway: GatewayThread, faults: FaultServer) -> None:
    # The target does not serve the model: another may (issue 12). From the only target, the client's 404.
    faults["alpha"].script(then=ok_200(RECORDED_400))
    resp = post(gateway, {"model": "pair", "prompt": "x"})
    assert resp.status_code == 200, resp.text
    assert faults.order() == ["alpha", "beta"]
    resp = post(gateway, {"model": "solo", "prompt": "x"})
    assert resp.status_code == 404, resp.text
    assert resp.json()["error"]["code"] == "model_not_found"
    assert faults.order() == ["alpha", "beta", "alpha"]


def test_stream_whose_first_event_is_an_error_envelope_fails_over(gateway: GatewayThread, faults: FaultServer) -> None:
    faults["alpha"].script(sse_error(OVERLOADED_BODY))
    resp = post(gateway, {"model": "pair", "prompt": "x", "stream": True})
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    assert "".join(json.loads(d)["choices"][0]["text"] for d in data[:-1]) == RECORDED_STREAM_TEXT
    assert faults.order() == ["alpha", "beta"]


def test_stream_whose_first_event_is_a_rate_limit_envelope_is_a_429(
    gateway: GatewayThread, faults: FaultServer
) -> None:
    faults["alpha"].script(then=sse_error(RATE_LIMIT_BODY))
    resp = post(gateway, {"model": "solo", "prompt": "x", "stream": True})
    assert resp.status_code == 429, resp.text
    assert resp.json()["error"]["code"] == "rate_limit_exceeded"


# --------------------------------------------------------------------------------------------------
# Item 10: a first stream event that cannot be read


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(b"data: this is not json", id="not-json"),
        pytest.param(b'data: {"choices": "nope"}', id="wrong-type"),
        pytest.param(b'data: {"hello": "world"}', id="no-choices"),
        pytest.param(b"data: [1, 2, 3]", id="array"),
        pytest.param(b'data: {"choices": [{"text": "\\ud800"}]', id="truncated"),
    ],
)
def test_invalid_first_stream_event_fails_over_to_a_second_target(
    gateway: GatewayThread, faults: FaultServer, event: bytes
) -> None:
    faults["alpha"].script(stream([event, *CHUNKS]))
    resp = post(gateway, {"model": "pair", "prompt": "x", "stream": True})
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    assert "".join(json.loads(d)["choices"][0]["text"] for d in data[:-1]) == RECORDED_STREAM_TEXT
    assert faults.order() == ["alpha", "beta"]


def test_invalid_first_stream_event_everywhere_is_a_502(gateway: GatewayThread, faults: FaultServer) -> None:
    faults["alpha"].script(then=stream([b"data: {not json"]))
    faults["beta"].script(then=stream([b"data: {not json"]))
    resp = post(gateway, {"model": "pair", "prompt": "x", "stream": True})
    assert resp.status_code == 502, resp.text
    err = resp.json()["error"]
    assert (err["type"], err["code"]) == ("upstream_error", "invalid_upstream_response")
    # Each target once: an unreadable answer is not asked for again from a target that gave one.
    assert resp.headers["x-gateway-attempts"] == "2"
    assert faults.order() == ["alpha", "beta"]


def test_stream_of_empty_events_fails_over_before_the_first_byte(gateway: GatewayThread, faults: FaultServer) -> None:
    empty = b'data: {"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": []}'
    faults["alpha"].script(stream([empty, empty]))
    resp = post(gateway, {"model": "pair", "prompt": "x", "stream": True})
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert "error" not in resp.text
    assert "".join(json.loads(d)["choices"][0]["text"] for d in data[:-1]) == RECORDED_STREAM_TEXT
    assert faults.order() == ["alpha", "beta"]
