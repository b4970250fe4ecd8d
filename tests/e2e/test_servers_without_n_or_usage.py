"""Upstreams that ignore `n` or report no usage in streams (completion and chat), as llama-cpp-python's server does
(`llama_cpp/server/app.py` answers one choice whatever `n` asks; its stream chunks carry no `usage`), over
real sockets through the `vllm` provider of the e2e config. The answers below are that server's shapes
(`llama_cpp/llama.py` `_create_completion`); tests/realservers/ runs the server itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers.accesslog import Lines
from tests.helpers.clients import sse_data
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream, reply, reply_sse
from tests.helpers.waiting import wait_until

MODEL = "vllm/tiny"


def _chunk(text: str, finish: str | None) -> bytes:
    body = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1_700_000_000,
        "model": "tiny",
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode()


STREAM = [_chunk(" one", None), _chunk(" two", None), _chunk("", "length"), b"data: [DONE]"]
ANSWER: dict[str, Any] = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1_700_000_000,
    "model": "tiny",
    "choices": [{"text": " one two", "index": 0, "logprobs": None, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


@pytest.fixture
def upstream(upstream_server: Upstream, gateway: GatewayThread) -> Iterator[Upstream]:
    upstream_server.reset()
    gateway.pipeline.services.ignores_n.clear()
    yield upstream_server
    upstream_server.reset()
    gateway.pipeline.services.ignores_n.clear()


def _error_of(resp: httpx.Response) -> dict[str, Any]:
    err: dict[str, Any] = resp.json()["error"]
    return err


def test_one_choice_for_n_2_unstreamed_is_a_502_naming_n(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(json.dumps(ANSWER).encode())
    resp = api.post("/v1/completions", json={"model": MODEL, "prompt": "p", "n": 2, "max_tokens": 2})
    assert resp.status_code == 502, resp.text
    err = _error_of(resp)
    assert (err["code"], err["param"]) == ("upstream_ignored_n", "n")
    assert "1 choice(s)" in err["message"] and "asked for 2" in err["message"]


def test_one_choice_for_n_2_streamed_ends_with_the_same_error(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_sse(STREAM)
    body = {"model": MODEL, "prompt": "p", "n": 2, "max_tokens": 2, "stream": True}
    with api.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        events = sse_data(resp.read().decode())
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["error"]["code"] == "upstream_ignored_n" and last["error"]["param"] == "n"
    # Known now: the next stream with n > 1 fails before its first byte, with the unstreamed answer's error.
    again = api.post("/v1/completions", json=body)
    assert again.status_code == 502, again.text
    assert _error_of(again)["code"] == "upstream_ignored_n"
    assert len(upstream.received) == 1
    # n = 1 is served as before.
    one = api.post("/v1/completions", json={**body, "n": 1})
    assert one.status_code == 200 and sse_data(one.text)[-1] == "[DONE]"


def test_a_stream_without_usage_books_the_gateways_estimate(
    api: httpx.Client, upstream: Upstream, access: Lines
) -> None:
    upstream.handler = reply_sse(STREAM)
    body = {"model": MODEL, "prompt": "a prompt of twenty-two", "max_tokens": 2, "stream": True}
    with api.stream("POST", "/v1/completions", json=body) as resp:
        events = sse_data(resp.read().decode())
    assert events[-1] == "[DONE]" and all("error" not in e for e in events)
    wait_until(lambda: access.lines)
    line = access.lines[-1]
    # 22 bytes at 4 bytes a token; three chunks carried choices.
    assert (line["prompt_tokens"], line["completion_tokens"], line["usage_estimated"]) == (6, 3, True)


def _chat_chunk(delta: dict[str, Any], finish: str | None) -> bytes:
    # llama-cpp-python's chat stream (`llama_chat_format.py`, `_convert_text_completion_chunks_to_chat`): the
    # role first, then the text, then the finish; no usage.
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "tiny",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode()


CHAT_STREAM = [
    _chat_chunk({"role": "assistant"}, None),
    _chat_chunk({"content": " one"}, None),
    _chat_chunk({"content": " two"}, None),
    _chat_chunk({}, "length"),
    b"data: [DONE]",
]


def test_a_chat_stream_without_usage_books_the_gateways_estimate_of_the_conversation(
    api: httpx.Client, upstream: Upstream, access: Lines
) -> None:
    upstream.handler = reply_sse(CHAT_STREAM)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a prompt of twenty-two"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 2, "stream": True}
    with api.stream("POST", "/v1/chat/completions", json=body) as resp:
        events = sse_data(resp.read().decode())
    assert events[-1] == "[DONE]" and all("error" not in e for e in events)
    assert all(json.loads(e)["choices"] for e in events[:-1])  # no usage chunk: the client did not ask
    wait_until(lambda: access.lines)
    line = access.lines[-1]
    assert line["endpoint"] == "chat" and line["usage_estimated"] is True
    # The conversation as the gateway renders it, `role: text` a line: 46 bytes at 4 bytes a token; four
    # chunks carried choices.
    rendered = "system: be brief\nuser: a prompt of twenty-two\n"
    assert (line["prompt_tokens"], line["completion_tokens"]) == (-(-len(rendered) // 4), 4)
