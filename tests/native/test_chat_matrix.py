"""Chat on every built-in kind, one matrix: {text, tool call} x {plain, streamed}, JSON output, and the
upstream's errors, each through the gateway (uvicorn, real socket) in front of a loopback upstream that
speaks the kind's own wire from a recording (tests/fixtures/SOURCES.md, "Chat matrix").

What the client gets is compared with what the recording holds: OpenAI's `chat.completion` and
`chat.completion.chunk` shapes, the text, each tool call's id, name and arguments byte for byte, the
finish reason as OpenAI names it, and the usage. An upstream error reaches a chat client with the status
and body a completions client gets for the same upstream answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.helpers.chat_answers import NATIVE_CASES, OPENAI_CASES, Want, joined
from tests.helpers.clients import sse_data
from tests.helpers.recordings import fixture_bytes, fixture_json, sse_events
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Handler, Upstream, reply, reply_sse
from tests.native.test_bedrock_e2e import AKID, SECRET, reply_eventstream

OPENAI_FAMILY = (
    "openai",
    "azure",
    "fireworks",
    "together",
    "deepseek",
    "mistral",
    "vllm",
    "sglang",
    "llamacpp",
    "tgi",
    "ollama",
    "pais",
    "sgp",
)
NATIVE = ("anthropic", "gemini", "cohere", "bedrock")
KINDS = (*OPENAI_FAMILY, *NATIVE)

CONFIG = """
unsupported_params: error
retries: {{attempts: 1}}
providers:
  openai: {{kind: openai, api_key: k, base_url: {url}/openai/v1}}
  azure: {{kind: azure, api_key: k, base_url: {url}/azure, api_version: "2024-06-01"}}
  fireworks: {{kind: fireworks, api_key: k, base_url: {url}/fireworks/inference/v1}}
  together: {{kind: together, api_key: k, base_url: {url}/together/v1}}
  deepseek: {{kind: deepseek, api_key: k, base_url: {url}/deepseek}}
  mistral: {{kind: mistral, api_key: k, base_url: {url}/mistral}}
  vllm: {{kind: vllm, base_url: {url}/vllm/v1, discover: false}}
  sglang: {{kind: sglang, base_url: {url}/sglang/v1, discover: false}}
  llamacpp: {{kind: llamacpp, base_url: {url}/llamacpp, discover: false}}
  tgi: {{kind: tgi, base_url: {url}/tgi, discover: false}}
  ollama: {{kind: ollama, base_url: {url}/ollama, discover: false}}
  pais: {{kind: pais, base_url: {url}/pais/api/v1/compatibility/openai/v1}}
  sgp: {{kind: sgp, api_key: k, base_url: {url}/sgp}}
  anthropic: {{kind: anthropic, api_key: k, base_url: {url}/anthropic}}
  gemini: {{kind: gemini, api_key: k, base_url: {url}/gemini}}
  cohere: {{kind: cohere, api_key: k, base_url: {url}/cohere}}
  bedrock:
    kind: bedrock
    region: us-east-1
    api_key: ${{AWS_ACCESS_KEY_ID}}:${{AWS_SECRET_ACCESS_KEY}}
    base_url: {url}/bedrock
"""
GATEWAY_ENV = {"AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET}

MODEL = {kind: f"{kind}/m" for kind in KINDS} | {"bedrock": "bedrock/amazon.nova-micro-v1:0"}
CHAT_PATH = {
    "openai": "/openai/v1/chat/completions",
    "azure": "/azure/openai/deployments/m/chat/completions",
    "fireworks": "/fireworks/inference/v1/chat/completions",
    "together": "/together/v1/chat/completions",
    "deepseek": "/deepseek/chat/completions",
    "mistral": "/mistral/v1/chat/completions",
    "vllm": "/vllm/v1/chat/completions",
    "sglang": "/sglang/v1/chat/completions",
    "llamacpp": "/llamacpp/v1/chat/completions",
    "tgi": "/tgi/v1/chat/completions",
    "ollama": "/ollama/v1/chat/completions",
    "pais": "/pais/api/v1/compatibility/openai/v1/chat/completions",
    "sgp": "/sgp/v4/beta/chat/completions",
    "anthropic": "/anthropic/v1/messages",
    "gemini": "/gemini/v1beta/models/m:generateContent",
    "cohere": "/cohere/v2/chat",
    "bedrock": "/bedrock/model/amazon.nova-micro-v1:0/converse",
}
STREAM_PATH = CHAT_PATH | {
    "gemini": "/gemini/v1beta/models/m:streamGenerateContent",
    "bedrock": "/bedrock/model/amazon.nova-micro-v1:0/converse-stream",
}

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather",
            "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
        },
    }
]
MESSAGES: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "CityLocation", "schema": SCHEMA, "strict": True}}


# Kinds whose chat route takes no `response_format` of type json_schema (docs/chat.md): a 400 naming the
# provider, no call.
REFUSE_JSON = ("anthropic", "deepseek")


def _case(kind: str, case: str) -> tuple[Callable[[], Want], str] | None:
    if case == "json" and kind in REFUSE_JSON:
        return None
    if kind in OPENAI_FAMILY:
        return OPENAI_CASES[case]
    return NATIVE_CASES[kind].get(case)


def _handler(rel: str) -> Handler:
    raw = fixture_bytes(rel)
    if rel.endswith(".eventstream"):
        return reply_eventstream(raw, 97)
    if rel.endswith(".sse.txt"):
        return reply_sse(sse_events(raw))
    return reply(raw)


def _request(case: str) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": MESSAGES, "max_tokens": 300}
    if case.startswith("tool"):
        body["tools"] = TOOLS
    if case == "json":
        body["response_format"] = JSON_FORMAT
    if case.endswith("_stream"):
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def _read_plain(resp: httpx.Response, model: str) -> Want:
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == model
    (choice,) = body["choices"]
    message = choice["message"]
    assert choice["index"] == 0 and message["role"] == "assistant"
    calls = []
    for call in message.get("tool_calls") or ():
        assert call["type"] == "function"
        calls.append((call["id"], call["function"]["name"], call["function"]["arguments"]))
    u = body["usage"]
    return Want(
        message["content"],
        calls,
        choice["finish_reason"],
        (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]),
    )


def _read_stream(resp: httpx.Response, model: str) -> Want:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == model for c in chunks), chunks
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    # The usage chunk, asked for, when the upstream reported usage (the gateway does not send its estimate).
    body, last = (chunks[:-1], chunks[-1]) if chunks[-1]["choices"] == [] else (chunks, None)
    finishes = [ch["finish_reason"] for c in body for ch in c["choices"] if ch.get("finish_reason")]
    assert len(finishes) == 1, finishes
    text, deltas = "", []
    for c in body:
        assert c.get("usage") is None
        for ch in c["choices"]:
            text += ch["delta"].get("content") or ""
            for tc in ch["delta"].get("tool_calls") or ():
                fn = tc.get("function") or {}
                deltas.append((tc["index"], tc.get("id"), fn.get("name"), fn.get("arguments") or ""))
    if last is None:
        return Want(text or None, joined(deltas), finishes[0], None)
    u = last["usage"]
    return Want(
        text or None, joined(deltas), finishes[0], (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"])
    )


def _same(got: Want, want: Want) -> None:
    assert got.content == want.content
    assert got.finish == want.finish
    assert len(got.calls) == len(want.calls)
    for (got_id, name, args), (want_id, want_name, want_args) in zip(got.calls, want.calls, strict=True):
        assert (name, args) == (want_name, want_args)  # the provider's arguments, byte for byte
        assert got_id if want_id is None else got_id == want_id
    assert got.usage == want.usage


CASES = ("text", "text_stream", "tool", "tool_stream", "json")
CELLS = [
    pytest.param(kind, case, id=f"{kind}-{case}") for kind in KINDS for case in CASES if _case(kind, case) is not None
]


@pytest.mark.parametrize(("kind", "case"), CELLS)
def test_answer(api: httpx.Client, upstream: Upstream, kind: str, case: str) -> None:
    found = _case(kind, case)
    assert found is not None
    want, rel = found
    upstream.handler = _handler(rel)
    resp = api.post("/v1/chat/completions", json={"model": MODEL[kind], **_request(case)})
    got = _read_stream(resp, MODEL[kind]) if case.endswith("_stream") else _read_plain(resp, MODEL[kind])
    _same(got, want())
    sent = upstream.only()
    assert sent.path == (STREAM_PATH if case.endswith("_stream") else CHAT_PATH)[kind]
    _check_sent(kind, case, sent.json())


def _check_sent(kind: str, case: str, body: dict[str, Any]) -> None:
    """The request's translation into the kind's wire: tools and response format where each goes."""
    if kind in OPENAI_FAMILY:
        assert body["messages"] == MESSAGES
        if case.startswith("tool"):
            assert body["tools"] == TOOLS
        if case == "json" and kind == "tgi":
            # TGI's Messages API takes the schema as its grammar.
            assert body["response_format"] == {"type": "json", "value": SCHEMA}
        elif case == "json":
            assert body["response_format"] == JSON_FORMAT
        return
    if kind == "anthropic":
        assert body["system"] == "Be brief."
        assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}]
        if case.startswith("tool"):
            fn = TOOLS[0]["function"]
            assert body["tools"] == [
                {"name": fn["name"], "description": fn["description"], "input_schema": fn["parameters"]}
            ]
    elif kind == "gemini":
        assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
        if case == "json":
            config = body["generationConfig"]
            assert (config["responseMimeType"], config["responseJsonSchema"]) == ("application/json", SCHEMA)
    elif kind == "cohere":
        assert body["messages"] == MESSAGES
        if case == "json":
            assert body["response_format"] == {"type": "json_object", "json_schema": SCHEMA}
    elif kind == "bedrock" and case == "json":
        text_format = body["outputConfig"]["textFormat"]
        assert text_format["type"] == "json_schema"
        assert json.loads(text_format["structure"]["jsonSchema"]["schema"]) == SCHEMA


@pytest.mark.parametrize("kind", REFUSE_JSON)
def test_json_output_refused(api: httpx.Client, upstream: Upstream, kind: str) -> None:
    resp = api.post("/v1/chat/completions", json={"model": MODEL[kind], **_request("json")})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["param"], error["code"]) == ("response_format", "unsupported_parameter")
    assert f"'{kind}'" in error["message"]
    assert upstream.received == []


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


# --- finish reasons and usage details -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "rel", "extra", "content", "finish"),
    [
        # Azure's filtered answer carries no message at all.
        ("azure", "azure/chat_finish_reason_content_filter.json", {}, None, "content_filter"),
        ("mistral", "mistral/chat_with_ratelimit_headers.json", {}, "Here's a light-hearted", "stop"),
        ("openai", "openai/chat_o3mini_stop_sequence.json", {"stop": ["Paris"]}, "The capital of France is ", "stop"),
        ("anthropic", "anthropic/messages_stop_sequence.json", {"stop": ["Paris"]}, "The beautiful city of ", "stop"),
        ("bedrock", "bedrock/converse_max_tokens.json", {"max_tokens": 5}, "The capital of France is", "length"),
        ("cohere", "cohere/v2_chat_stop_sequence.json", {"stop": ["Paris"]}, "The capital of France is", "stop"),
    ],
    ids=[
        "azure-content_filter",
        "mistral-stop",
        "openai-stop",
        "anthropic-stop_sequence",
        "bedrock-max_tokens",
        "cohere-stop",
    ],
)
def test_finish_reason(
    api: httpx.Client, upstream: Upstream, kind: str, rel: str, extra: dict[str, Any], content: str | None, finish: str
) -> None:
    upstream.handler = _handler(rel)
    resp = api.post("/v1/chat/completions", json={"model": MODEL[kind], "messages": MESSAGES, **extra})
    assert resp.status_code == 200, resp.text
    (choice,) = resp.json()["choices"]
    assert choice["finish_reason"] == finish
    if content is None:
        assert choice["message"]["content"] is None
    else:
        assert choice["message"]["content"].startswith(content)


def test_usage_details_reach_the_client(api: httpx.Client, upstream: Upstream) -> None:
    """Reasoning tokens (OpenAI's o-series) and tokens read from the provider's prompt cache (Bedrock's
    `cacheReadInputTokens`) keep their place in OpenAI's usage."""
    recorded = fixture_json("openai/chat_o3mini_stop_sequence.json")["usage"]
    upstream.handler = _handler("openai/chat_o3mini_stop_sequence.json")
    usage = api.post("/v1/chat/completions", json={"model": MODEL["openai"], "messages": MESSAGES}).json()["usage"]
    assert (
        usage["completion_tokens_details"]["reasoning_tokens"]
        == recorded["completion_tokens_details"]["reasoning_tokens"]
    )
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        recorded["prompt_tokens"],
        recorded["completion_tokens"],
    )

    cached = fixture_json("bedrock/converse_cache_read.json")["usage"]
    upstream.handler = _handler("bedrock/converse_cache_read.json")
    usage = api.post("/v1/chat/completions", json={"model": MODEL["bedrock"], "messages": MESSAGES}).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == cached["cacheReadInputTokens"]


def test_anthropic_error_event_mid_stream(api: httpx.Client, upstream: Upstream) -> None:
    """Anthropic's `event: error` after the stream started (its documented `overloaded_error`): the text so
    far, then the error event in OpenAI's envelope, then [DONE]."""
    events = sse_events(fixture_bytes("anthropic/messages_stream.sse.txt"))[:4]  # through the first text delta
    events.append(b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}')
    upstream.handler = reply_sse(events)
    resp = api.post("/v1/chat/completions", json={"model": MODEL["anthropic"], "messages": MESSAGES, "stream": True})
    assert resp.status_code == 200
    data = sse_data(resp.text)
    assert [json.loads(d)["choices"][0]["delta"].get("content") for d in data[:2]] == ["", "2"]
    assert json.loads(data[2]) == {
        "error": {
            "message": "anthropic error (529): Overloaded",
            "type": "upstream_error",
            "param": None,
            "code": "overloaded_error",
        }
    }
    assert data[3:] == ["[DONE]"]


def test_error_as_the_first_stream_event_is_the_streams_status(api: httpx.Client, upstream: Upstream) -> None:
    """An OpenAI-compatible server that answers 200 and then only an error event (OpenAI's envelope): the
    client gets the error's status, as before any byte was sent."""
    upstream.handler = reply_sse(
        [b'data: {"error":{"message":"The server had an error","type":"server_error","param":null,"code":null}}']
    )
    resp = api.post("/v1/chat/completions", json={"model": MODEL["vllm"], "messages": MESSAGES, "stream": True})
    assert resp.status_code == 502
    assert resp.json()["error"]["message"] == "upstream error (500): The server had an error"
