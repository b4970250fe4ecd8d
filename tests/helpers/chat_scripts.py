"""A loopback upstream whose paths play chat providers, scripted per test: vLLM's chat stream (a role chunk
with empty content, one content chunk per piece, the finish chunk, the usage chunk) and Anthropic's Messages
stream (the events of tests/fixtures/anthropic/messages_stream.sse.txt), and what each path received."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream

Behave = Callable[[web.Request, Received], Awaitable[web.StreamResponse]]


def chunk_event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
    body = {
        "id": "chatcmpl-up",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": choices,
        "usage": usage,
    }
    return b"data: " + json.dumps(body).encode()


def delta_event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return chunk_event([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}])


def vllm_stream(pieces: list[str], *, usage: tuple[int, int] | None, cut: bool = False) -> Behave:
    """A vLLM chat stream of `pieces`; `cut`: the connection is reset after them (no finish)."""

    async def behave(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        events = [delta_event({"role": "assistant", "content": ""})] + [delta_event({"content": p}) for p in pieces]
        if not cut:
            events.append(delta_event({}, "stop"))
            if usage is not None:
                p, c = usage
                events.append(chunk_event([], {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}))
            events.append(b"data: [DONE]")
        for e in events:
            await resp.write(e + b"\n\n")
        if cut:
            await asyncio.sleep(0.05)  # the chunks reach the gateway before the reset
            assert request.transport is not None
            request.transport.abort()
            await asyncio.sleep(5)
        else:
            await resp.write_eof()
        return resp

    return behave


def anthropic_stream(texts: list[str]) -> Behave:
    """Anthropic's Messages stream (the recording's events) with `texts` as the text deltas."""

    def event(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}".encode()

    async def behave(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        start: dict[str, Any] = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "claude-sonnet",
        }
        start["usage"] = {"input_tokens": 30, "output_tokens": 1}
        events = [
            event("message_start", {"type": "message_start", "message": start}),
            event(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
        ]
        for t in texts:
            delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}
            events.append(event("content_block_delta", delta))
        events += [
            event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            event(
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}},
            ),
            event("message_stop", {"type": "message_stop"}),
        ]
        for e in events:
            await resp.write(e + b"\n\n")
        await resp.write_eof()
        return resp

    return behave


class Script:
    """What each upstream path does, per test, and what each received."""

    def __init__(self) -> None:
        self.behaviours: dict[str, Behave] = {}
        self.received: dict[str, list[Received]] = {}

    async def __call__(self, request: web.Request, received: Received) -> web.StreamResponse:
        name = received.path.split("/")[1]
        self.received.setdefault(name, []).append(received)
        behave = self.behaviours.get(name)
        if behave is None:
            return web.json_response({"error": {"message": f"nothing scripted for {name}"}}, status=599)
        return await behave(request, received)


def scripted(upstream: Upstream, gateway: GatewayThread) -> Script:
    """A fresh script on `upstream`, with the gateway's target health forgotten (a test's breaks cool targets)."""
    s = Script()
    upstream.handler = s
    gateway.pipeline.health.reset()
    return s
