"""Item 13 of issue 11: a stream that fails after it started still ends properly.

Before the fix, an unexpected exception after the first byte ended the response with neither an error
event nor `data: [DONE]`: raw clients saw a truncated stream and SDKs an unexplained end. It was found with
the built-in `fake` provider asked for logprobs with an empty prompt in a list (it tripped over its own
empty token list); here the fake's `crash-after-2` behaviour raises such an exception on purpose, as any
adapter bug would. Now the client gets OpenAI's error envelope with a generic message (no traceback, no
internal detail) and then `[DONE]`; the traceback goes to the log.
Real sockets: the gateway served by uvicorn, raw HTTP and the official openai SDK as clients.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.helpers.clients import openai_client, sse_data
from tests.helpers.servers import GatewayThread, serve_config

CONFIG = """
server: {host: 127.0.0.1, port: 0}
providers:
  demo: {kind: fake, models: [text, crash-after-2]}
"""
# Two chunks go out, then the provider raises something that is not a GatewayError, as a bug would.
BROKEN_MID_STREAM = {"model": "demo/crash-after-2", "prompt": "hello there", "max_tokens": 8}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("stream-failures"), CONFIG) as gw:
        yield gw


def test_exception_mid_stream_ends_with_an_error_event_and_done(
    gateway: GatewayThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="gateway")
    with httpx.Client(trust_env=False, timeout=15) as client:
        resp = client.post(gateway.url + "/v1/completions", json={**BROKEN_MID_STREAM, "stream": True})
    assert resp.status_code == 200
    data = sse_data(resp.text)
    assert json.loads(data[0])["choices"][0]["text"]  # the stream had started
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2]) == {
        "error": {
            "message": "The gateway failed to process the request",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
    assert "Traceback" not in resp.text and "FakeCrash" not in resp.text and "fake crash" not in resp.text
    assert "stream failed after it started" in caplog.text and "FakeCrash" in caplog.text


@pytest.mark.parametrize("route", ["/v4/beta/completions", "/api/v1/compatibility/openai/v1/completions"])
def test_every_dialect_gets_the_error_event_and_done(gateway: GatewayThread, route: str) -> None:
    with httpx.Client(trust_env=False, timeout=15) as client:
        resp = client.post(gateway.url + route, json={**BROKEN_MID_STREAM, "stream": True})
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["error"]["type"] == "server_error"


def test_the_openai_sdk_raises_instead_of_ending_quietly(gateway: GatewayThread) -> None:
    with openai_client(gateway.url + "/v1", "unused") as client:
        texts: list[str] = []
        with pytest.raises(openai.APIError) as info:
            for chunk in client.completions.create(**BROKEN_MID_STREAM, stream=True):  # type: ignore[call-overload]
                texts.extend(c.text for c in chunk.choices)
    assert texts  # it failed after the first chunks, not before
    assert "The gateway failed to process the request" in str(info.value)


def test_the_gateway_keeps_serving_after_it(gateway: GatewayThread) -> None:
    with httpx.Client(trust_env=False, timeout=15) as client:
        client.post(gateway.url + "/v1/completions", json={**BROKEN_MID_STREAM, "stream": True})
        ok = client.post(gateway.url + "/v1/completions", json={"model": "demo/text", "prompt": "hi", "stream": True})
    assert sse_data(ok.text)[-1] == "[DONE]"
