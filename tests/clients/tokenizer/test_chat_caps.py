"""The chat form of `/tokenize` held to the chat route's request caps, over real sockets: how many messages
a conversation may send (`caps.chat_messages`), how many content parts they may hold together
(`caps.chat_content_parts`) and how deep the openai SDK's echoes of a parsed answer may nest
(`caps.json_depth`). Beyond any of them the client gets a 400 naming the field before the loopback vLLM
is asked; at the caps the conversation is tokenized, the SDK's echoes left out of what vLLM is sent.

The vLLM answer follows `vllm/entrypoints/serve/tokenize/protocol.py` (TokenizeResponse), as in conftest.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.clients.tokenizer.upstreams import error_envelope
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream, reply

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
caps: {{chat_messages: 4, chat_content_parts: 3, json_depth: 4}}
providers:
  vl: {{kind: vllm, base_url: {u}/v1}}
"""
TOKENIZED = json.dumps({"count": 2, "max_model_len": 2048, "tokens": [72, 105], "token_strs": None}).encode()


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as u:
        yield u


@pytest.fixture(scope="module")
def gw(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("tokenize-caps"), CONFIG.format(u=upstream.url)) as g:
        yield g


@pytest.fixture
def api(gw: GatewayThread, upstream: Upstream) -> Iterator[httpx.Client]:
    upstream.reset()
    upstream.handler = reply(TOKENIZED)
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=15) as client:
        yield client


def _tokenize(api: httpx.Client, messages: list[Any]) -> httpx.Response:
    return api.post("/tokenize", json={"model": "vl/m", "messages": messages})


def _nested(levels: int) -> Any:
    value: Any = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def test_at_the_caps_the_conversation_is_tokenized_without_the_sdks_echoes(
    api: httpx.Client, upstream: Upstream
) -> None:
    call: dict[str, Any] = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    answer = {
        "role": "assistant",
        "content": '{"a": 1}',
        "parsed": _nested(4),
        "annotations": [],
        "tool_calls": [{**call, "function": {**call["function"], "parsed_arguments": _nested(4)}}],
    }
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}] * 3},
        answer,
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "user", "content": "Hi"},
    ]
    resp = _tokenize(api, messages)
    assert resp.status_code == 200, resp.text
    sent = upstream.only().json()["messages"]
    assert len(sent) == 4
    assert set(sent[1]) == {"role", "content", "tool_calls"}, sent[1]
    assert sent[1]["tool_calls"] == [call]


def test_more_messages_than_the_cap_is_a_400_naming_messages(api: httpx.Client, upstream: Upstream) -> None:
    message = error_envelope(_tokenize(api, [{"role": "user", "content": "x"}] * 5), 400, "invalid_value", "messages")
    assert "5 messages" in message and "at most 4" in message, message
    assert upstream.received == []


def test_more_content_parts_than_the_cap_is_a_400_naming_the_message(api: httpx.Client, upstream: Upstream) -> None:
    two: list[Any] = [{"type": "text", "text": "x"}] * 2
    messages = [
        {"role": "user", "content": two},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": two},
    ]
    message = error_envelope(_tokenize(api, messages), 400, "invalid_value", "messages.content")
    assert "messages[2].content" in message and "at most 3" in message, message
    assert upstream.received == []


@pytest.mark.parametrize(
    ("field", "param"),
    [
        ("parsed", "messages.parsed"),
        ("annotations", "messages.annotations"),
        ("parsed_arguments", "messages.tool_calls.function.parsed_arguments"),
    ],
)
def test_an_sdk_echo_nested_past_json_depth_is_a_400_naming_it(
    api: httpx.Client, upstream: Upstream, field: str, param: str
) -> None:
    answer: dict[str, Any] = {"role": "assistant", "content": "{}"}
    if field == "parsed_arguments":
        function = {"name": "f", "arguments": "{}", "parsed_arguments": _nested(5)}
        answer["tool_calls"] = [{"id": "c1", "type": "function", "function": function}]
    else:
        answer[field] = [_nested(4)] if field == "annotations" else _nested(5)
    messages = [{"role": "user", "content": "Hi"}, answer]
    message = error_envelope(_tokenize(api, messages), 400, "too_deeply_nested", param)
    assert "more than 4 levels" in message and "messages[1]." in message, message
    assert upstream.received == []
