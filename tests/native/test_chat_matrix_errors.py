"""The chat matrix's upstream errors: an upstream error reaches a chat client with the status and body a
completions client gets for the same upstream answer, on every built-in kind (tests/fixtures/SOURCES.md,
"Chat matrix").
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream, reply
from tests.native import chat_matrix_setup
from tests.native.chat_matrix_setup import KINDS, MESSAGES, MODEL

# The gateway fixture (tests/native/conftest.py) reads these from the test module.
CONFIG, GATEWAY_ENV = chat_matrix_setup.CONFIG, chat_matrix_setup.GATEWAY_ENV

# --- upstream errors ---------------------------------------------------------------------------------


def _openai_error(status: int, type_: str, code: str | None, message: str) -> bytes:
    """OpenAI's envelope as recorded (openai/error_400_model_not_found.json), with another status's values."""
    body: dict[str, Any] = fixture_json("openai/error_400_model_not_found.json")
    body["error"].update(message=message, type=type_, code=code, param=None)
    return json.dumps(body).encode()


Error = tuple[int, bytes, bytes, dict[str, str]]  # status, chat route's body, completion route's body, headers


def _same_body(status: int, body: bytes, headers: dict[str, str] | None = None) -> Error:
    return (status, body, body, headers or {})


def _errors(kind: str) -> list[Error]:
    """Errors in the kind's own shape: recorded where a recording exists, else the shape its documentation
    or source gives (SOURCES.md, "Chat matrix"). Ollama's OpenAI route (chat) and its native API
    (completions) answer in different shapes."""
    if kind == "anthropic":
        return [
            _same_body(400, fixture_bytes("anthropic/error_400_invalid_request.json")),
            _same_body(429, b'{"type":"error","error":{"type":"rate_limit_error","message":"Rate limited"}}'),
            _same_body(529, b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'),
        ]
    if kind == "gemini":
        return [
            _same_body(400, b'{"error":{"code":400,"message":"Invalid value","status":"INVALID_ARGUMENT"}}'),
            _same_body(
                429, b'{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED"}}'
            ),
            _same_body(500, b'{"error":{"code":500,"message":"An internal error has occurred","status":"INTERNAL"}}'),
        ]
    if kind == "cohere":
        return [
            _same_body(400, b'{"id":"e1","message":"invalid request: message must be at least 1 token long"}'),
            _same_body(
                429, b'{"id":"e2","message":"You are using a Trial key, which is limited to 20 API calls / minute."}'
            ),
            _same_body(500, b'{"id":"e3","message":"internal server error, this has been reported to our developers"}'),
        ]
    if kind == "bedrock":
        return [
            _same_body(400, fixture_bytes("bedrock/error_400_invalid_model.json")),
            _same_body(
                429,
                fixture_bytes("bedrock/error_429_throttling.json"),
                {"x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"},
            ),
            _same_body(500, b'{"message":"Internal server error"}', {"x-amzn-ErrorType": "InternalServerException"}),
        ]
    if kind == "mistral":
        return [
            _same_body(
                400,
                b'{"object":"error","message":"Invalid model: m","type":"invalid_model","param":null,"code":"1500"}',
            ),
            _same_body(
                429,
                b'{"object":"error","message":"Rate limit exceeded","type":"rate_limited","param":null,"code":"1300"}',
                {"retry-after": "7"},
            ),
            _same_body(
                500, b'{"object":"error","message":"Internal error","type":"internal_error","param":null,"code":null}'
            ),
        ]
    if kind == "llamacpp":
        return [
            _same_body(400, b'{"error":{"code":400,"message":"\\"prompt\\" is empty","type":"invalid_request_error"}}'),
            _same_body(503, b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'),
            _same_body(500, b'{"error":{"code":500,"message":"Failed to tokenize","type":"server_error"}}'),
        ]
    if kind == "tgi":
        return [
            _same_body(422, fixture_bytes("tgi/error_422_validation.json")),
            _same_body(429, b'{"error":"Model is overloaded","error_type":"overloaded"}'),
            _same_body(
                424, b'{"error":"Request failed during generation: CUDA out of memory","error_type":"generation"}'
            ),
        ]
    if kind == "ollama":
        return [
            (
                404,
                b'{"error":{"message":"model \\"m\\" not found, try pulling it first","type":"not_found_error",'
                b'"param":null,"code":null}}',
                b'{"error":"model \\"m\\" not found, try pulling it first"}',
                {},
            ),
            (
                400,
                b'{"error":{"message":"invalid message format","type":"invalid_request_error",'
                b'"param":null,"code":null}}',
                b'{"error":"invalid message format"}',
                {},
            ),
            (
                500,
                b'{"error":{"message":"llama runner process has terminated","type":"api_error",'
                b'"param":null,"code":null}}',
                b'{"error":"llama runner process has terminated"}',
                {},
            ),
        ]
    first = _same_body(400, fixture_bytes("openai/error_400_model_not_found.json"))
    if kind == "vllm":
        first = _same_body(404, fixture_bytes("vllm/error_404_model_not_found.json"))
    return [
        first,
        _same_body(
            429, _openai_error(429, "requests", "rate_limit_exceeded", "Rate limit reached"), {"retry-after": "7"}
        ),
        _same_body(500, _openai_error(500, "server_error", None, "The server had an error")),
    ]


ERROR_CELLS = [pytest.param(kind, i, id=f"{kind}-{i}") for kind in KINDS for i in range(3)]


@pytest.mark.parametrize(("kind", "which"), ERROR_CELLS)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_upstream_error_as_on_completions(
    api: httpx.Client, gateway: GatewayThread, upstream: Upstream, kind: str, which: int, stream: bool
) -> None:

    status, chat_body, completion_body, headers = _errors(kind)[which]
    extra = {"stream": True} if stream else {}
    upstream.handler = reply(completion_body, status=status, headers=headers)
    completion = api.post("/v1/completions", json={"model": MODEL[kind], "prompt": "Weather in Paris?", **extra})
    upstream.handler = reply(chat_body, status=status, headers=headers)
    gateway.pipeline.health.reset()  # the first failure must not cool the target down for the second call
    chat = api.post("/v1/chat/completions", json={"model": MODEL[kind], "messages": MESSAGES, **extra})
    assert chat.status_code == completion.status_code, (chat.text, completion.text)
    assert chat.json() == completion.json()
    assert chat.headers["content-type"].startswith("application/json")
    assert chat.headers.get("retry-after") == completion.headers.get("retry-after")
    if status in (400, 404, 422, 429):
        assert chat.status_code == status
    else:  # the upstream's own failure (TGI's 424 is a failed generation): a gateway error
        assert chat.status_code >= 500
    # The provider's own words reach the client, never its raw body.
    message = chat.json()["error"]["message"]
    assert message.startswith(f"{kind} error ({status}): ") and "{" not in message, message
    assert len(upstream.received) == 2
