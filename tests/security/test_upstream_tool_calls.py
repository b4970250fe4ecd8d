"""An upstream chat answer of more tool calls than `MAX_CALLS`.

A stream that starts call after call at new indexes, on each kind that keeps an entry per call it streams
(OpenAI's wire, Anthropic, Bedrock's Converse, Cohere): each entry stayed for the life of the stream and nothing
bounded their number, so an upstream could grow the gateway's memory for as long as it streamed (some 60,000
OpenAI-wire call pieces fit in one 1 MiB event). A buffered OpenAI-wire answer of `{}` calls: each 3 bytes became
a call with a made id, about 100 bytes in the client's answer and hundreds in memory (3 MB of them held some
350 MiB). Past the cap the stream now ends with an `invalid_upstream_response` error event, and the buffered
answer is that 502; an answer of as many calls as the cap is relayed whole. Calls started at a block index
already used each count, and each is a call of its own with its own arguments.

Over real sockets: the gateway served by uvicorn, one aiohttp loopback upstream playing each kind's answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, Final

import httpx
import pytest

from providers.call_cap import MAX_CALLS
from tests.helpers.clients import sse_data
from tests.helpers.eventstream import event as frame
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Handler, Upstream, reply, reply_sse, reply_stream

CONFIG: Final = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
providers:
  oa: {{kind: openai, api_key: sk-calls, base_url: "{u}/v1"}}
  an: {{kind: anthropic, api_key: sk-ant-calls, base_url: "{u}"}}
  aws: {{kind: bedrock, region: us-east-1, api_key: "AKIDEXAMPLE:secret", base_url: "{u}"}}
  co: {{kind: cohere, api_key: co-calls, base_url: "{u}"}}
"""
TOOLS: Final = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}".encode()


def openai(calls: int) -> Handler:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
        return b"data: " + json.dumps(body, separators=(",", ":")).encode()

    pieces = [{"index": k, "function": {"arguments": ""}} for k in range(calls)]  # 32 bytes a call
    return reply_sse(
        [chunk({"role": "assistant"}), chunk({"tool_calls": pieces}), chunk({}, "tool_calls"), b"data: [DONE]"]
    )


def anthropic(calls: int, reused: bool = False) -> Handler:
    message = {"id": "m", "type": "message", "role": "assistant", "model": "c", "content": []}
    events = [_sse("message_start", {"type": "message_start", "message": {**message, "usage": {"input_tokens": 1}}})]
    for k in range(calls):
        use = {"type": "tool_use", "id": f"t{k}", "name": "f", "input": {}}
        events.append(
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": 0 if reused else k, "content_block": use},
            )
        )
    end = {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 1}}
    events += [_sse("message_delta", end), _sse("message_stop", {"type": "message_stop"})]
    return reply_sse(events)


def bedrock(calls: int) -> Handler:
    frames = [frame("messageStart", {"role": "assistant"})]
    for k in range(calls):
        frames.append(
            frame(
                "contentBlockStart", {"contentBlockIndex": k, "start": {"toolUse": {"toolUseId": f"t{k}", "name": "f"}}}
            )
        )
    frames.append(frame("messageStop", {"stopReason": "tool_use"}))
    usage = {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}
    frames.append(frame("metadata", {"usage": usage, "metrics": {"latencyMs": 1}}))
    return reply_stream(frames, "application/vnd.amazon.eventstream")


def cohere(calls: int) -> Handler:
    start = {"type": "message-start", "id": "m", "delta": {"message": {"role": "assistant"}}}
    events = [_sse("message-start", start)]
    for k in range(calls):
        call = {"id": f"t{k}", "type": "function", "function": {"name": "f", "arguments": ""}}
        events.append(
            _sse("tool-call-start", {"type": "tool-call-start", "index": k, "delta": {"message": {"tool_calls": call}}})
        )
    usage = {"billed_units": {"input_tokens": 1, "output_tokens": 1}, "tokens": {"input_tokens": 1, "output_tokens": 1}}
    end = {"type": "message-end", "delta": {"finish_reason": "TOOL_CALL", "usage": usage}}
    events.append(_sse("message-end", end))
    return reply_sse(events)


KINDS: Final[dict[str, tuple[str, Callable[[int], Handler]]]] = {
    "openai": ("oa/gpt-4o", openai),
    "anthropic": ("an/claude-sonnet-4-5", anthropic),
    "bedrock": ("aws/anthropic.claude-3-haiku-20240307-v1:0", bedrock),
    "cohere": ("co/command-a-03-2025", cohere),
}


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def gw(up: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("calls"), CONFIG.format(u=up.url)) as served:
        yield served


def stream(gw: GatewayThread, model: str) -> list[Any]:
    body = {"model": model, "stream": True, "max_tokens": 8, "tools": TOOLS}
    body["messages"] = [{"role": "user", "content": "call f"}]
    with httpx.Client(trust_env=False, timeout=60) as client:
        resp = client.post(gw.url + "/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text[:500]
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def started(events: list[Any]) -> set[int]:
    """The tool calls the client's stream started (by their index in the answer)."""
    return {
        t["index"]
        for e in events
        for c in e.get("choices", ())
        for t in c["delta"].get("tool_calls") or ()
        if t.get("id")
    }


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_stream_of_more_calls_than_the_cap_ends_with_an_error(gw: GatewayThread, up: Upstream, kind: str) -> None:
    model, play = KINDS[kind]
    up.handler = play(MAX_CALLS + 1)
    events = stream(gw, model)
    assert "error" in events[-1], events[-1]
    assert events[-1]["error"]["code"] == "invalid_upstream_response"
    assert len(started(events)) <= MAX_CALLS


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_stream_of_as_many_calls_as_the_cap_is_relayed_whole(gw: GatewayThread, up: Upstream, kind: str) -> None:
    model, play = KINDS[kind]
    up.handler = play(MAX_CALLS)
    events = stream(gw, model)
    assert not any("error" in e for e in events)
    assert started(events) == set(range(MAX_CALLS))
    assert [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]] == ["tool_calls"]


def buffered(calls: int) -> Handler:
    """An OpenAI-wire answer whose one choice holds `calls` empty tool calls (3 bytes each)."""
    tool_calls = b",".join([b"{}"] * calls)
    message = b'{"role":"assistant","content":null,"tool_calls":[' + tool_calls + b"]}"
    return reply(
        b'{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":'
        + message
        + b',"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
    )


def ask(gw: GatewayThread) -> httpx.Response:
    body = {"model": "oa/gpt-4o", "max_tokens": 8, "tools": TOOLS, "messages": [{"role": "user", "content": "f"}]}
    with httpx.Client(trust_env=False, timeout=60) as client:
        return client.post(gw.url + "/v1/chat/completions", json=body)


def test_a_buffered_answer_of_more_calls_than_the_cap_is_a_502(gw: GatewayThread, up: Upstream) -> None:
    up.handler = buffered(MAX_CALLS)
    resp = ask(gw)
    assert resp.status_code == 200, resp.text[:300]
    calls = resp.json()["choices"][0]["message"]["tool_calls"]
    assert len(calls) == MAX_CALLS and len({c["id"] for c in calls}) == MAX_CALLS
    up.handler = buffered(MAX_CALLS + 1)
    resp = ask(gw)
    assert resp.status_code == 502, resp.text[:300]
    assert resp.json()["error"]["code"] == "invalid_upstream_response"


# A stream whose blocks reuse an index (two calls at 1, then a call at 0 again), each call's arguments right after
# its start. The upstream's index is its block's, not the call's: each start is a call of its own.
REUSED: Final = (0, 1, 1, 0)


def _reused(kind: str) -> Handler:
    if kind == "anthropic":
        message = {"id": "m", "type": "message", "role": "assistant", "model": "c", "content": []}
        events = [
            _sse("message_start", {"type": "message_start", "message": {**message, "usage": {"input_tokens": 1}}})
        ]
        for n, k in enumerate(REUSED):
            use = {"type": "tool_use", "id": f"t{n}", "name": "f", "input": {}}
            events.append(
                _sse("content_block_start", {"type": "content_block_start", "index": k, "content_block": use})
            )
            piece = {"type": "input_json_delta", "partial_json": f'{{"n": {n}}}'}
            events.append(_sse("content_block_delta", {"type": "content_block_delta", "index": k, "delta": piece}))
        end = {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 1}}
        return reply_sse([*events, _sse("message_delta", end), _sse("message_stop", {"type": "message_stop"})])
    if kind == "bedrock":
        frames = [frame("messageStart", {"role": "assistant"})]
        for n, k in enumerate(REUSED):
            block = {"toolUse": {"toolUseId": f"t{n}", "name": "f"}}
            frames.append(frame("contentBlockStart", {"contentBlockIndex": k, "start": block}))
            part = {"toolUse": {"input": f'{{"n": {n}}}'}}
            frames.append(frame("contentBlockDelta", {"contentBlockIndex": k, "delta": part}))
        frames.append(frame("messageStop", {"stopReason": "tool_use"}))
        totals = {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}
        frames.append(frame("metadata", {"usage": totals, "metrics": {"latencyMs": 1}}))
        return reply_stream(frames, "application/vnd.amazon.eventstream")
    events = [_sse("message-start", {"type": "message-start", "id": "m", "delta": {"message": {"role": "assistant"}}})]
    for n, k in enumerate(REUSED):
        call = {"id": f"t{n}", "type": "function", "function": {"name": "f", "arguments": ""}}
        start = {"type": "tool-call-start", "index": k, "delta": {"message": {"tool_calls": call}}}
        args = {"tool_calls": {"function": {"arguments": f'{{"n": {n}}}'}}}
        events += [
            _sse("tool-call-start", start),
            _sse("tool-call-delta", {"type": "tool-call-delta", "index": k, "delta": {"message": args}}),
        ]
    billed = {
        "billed_units": {"input_tokens": 1, "output_tokens": 1},
        "tokens": {"input_tokens": 1, "output_tokens": 1},
    }
    ended = {"type": "message-end", "delta": {"finish_reason": "TOOL_CALL", "usage": billed}}
    return reply_sse([*events, _sse("message-end", ended)])


@pytest.mark.parametrize("kind", ["anthropic", "bedrock", "cohere"])
def test_a_block_index_used_again_starts_a_call_of_its_own(gw: GatewayThread, up: Upstream, kind: str) -> None:
    """Each start is a new call numbered after the ones before it, and its arguments are its own: never the
    number of an earlier call, which the client would merge it into."""
    up.handler = _reused(kind)
    events = stream(gw, KINDS[kind][0])
    assert not any("error" in e for e in events)
    calls: dict[int, dict[str, str]] = {}
    for e in events:
        for c in e["choices"]:
            for t in c["delta"].get("tool_calls") or ():
                call = calls.setdefault(t["index"], {"id": "", "arguments": ""})
                call["id"] += t.get("id") or ""
                call["arguments"] += t["function"].get("arguments") or ""
    assert calls == {n: {"id": f"t{n}", "arguments": f'{{"n": {n}}}'} for n in range(len(REUSED))}


def test_calls_started_at_one_block_index_count_toward_the_cap(gw: GatewayThread, up: Upstream) -> None:
    up.handler = anthropic(MAX_CALLS + 1, reused=True)
    events = stream(gw, KINDS["anthropic"][0])
    assert events[-1]["error"]["code"] == "invalid_upstream_response", events[-1]
