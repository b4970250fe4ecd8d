"""A loopback inference engine: an `Upstream` that counts the requests it has in flight and runs them as a
server with a bounded running batch would.

It answers OpenAI-style completions and chat completions (buffered or SSE with a usage chunk). A request's
prompt (a chat request's last message) starts with its tenant's name (`"quiet hello"`), which `order` records
in arrival order; `max_tokens` is how many tokens it
generates, each taking `per_token_s` once it runs. With `batch`, at most that many run at once and the rest
wait in the engine's own first-come queue, as vLLM's scheduler queues what does not fit. While `running` is
clear every request waits before it starts (a test fills the gateway's queue meanwhile).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

from aiohttp import web

from tests.helpers.upstreams import Received, Upstream


class Engine(Upstream):
    def __init__(
        self, *, batch: int | None = None, per_token_s: float = 0.0, hold_s: float = 0.0, settle: bool = False
    ) -> None:
        super().__init__()
        # `settle`: a request that arrives in the same moment as another's disconnect (a hedge or an attempt
        # the gateway gave up on, whose slot it gave back as it closed that connection) is counted in flight
        # after that disconnect, whose cancelled handler runs in the same loop passes; else at once.
        self.settle = settle
        self.batch = batch
        self.per_token_s = per_token_s
        self.hold_s = hold_s
        self.inflight = 0
        self.peak = 0
        self.order: list[str] = []
        self.done: list[tuple[str, float, int]] = []  # (tenant, finished at, tokens) per request answered
        self.failures = 0  # the next this many requests answer 503 after their hold (retries, failover)
        self.running = threading.Event()
        self.running.set()
        self._sem: asyncio.Semaphore | None = None
        self.handler = self._serve

    async def _serve(self, request: web.Request, received: Received) -> web.StreamResponse:
        body = received.json()
        messages = body.get("messages")
        prompt = str(body["prompt"] if messages is None else messages[-1]["content"])
        tenant = prompt.split()[0]
        tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 1)
        self.order.append(tenant)
        if self.settle:
            for _ in range(3):
                await asyncio.sleep(0)
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        try:
            while not self.running.is_set():
                await asyncio.sleep(0.002)
            if self.batch is not None:
                if self._sem is None:
                    self._sem = asyncio.Semaphore(self.batch)
                async with self._sem:
                    return await self._answer(request, body, prompt, tenant, tokens)
            return await self._answer(request, body, prompt, tenant, tokens)
        finally:
            self.inflight -= 1

    async def _answer(
        self, request: web.Request, body: dict[str, object], prompt: str, tenant: str, tokens: int
    ) -> web.StreamResponse:
        if self.failures > 0:
            self.failures -= 1
            await asyncio.sleep(self.hold_s)
            return web.Response(
                status=503, text='{"error": {"message": "overloaded"}}', content_type="application/json"
            )
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": tokens}
        usage["total_tokens"] = usage["prompt_tokens"] + tokens
        chat = "messages" in body
        if not body.get("stream"):
            await asyncio.sleep(self.hold_s + tokens * self.per_token_s)
            self.done.append((tenant, time.monotonic(), usage["total_tokens"]))
            answer = _chat_completion if chat else _completion
            return web.Response(body=answer("x" * tokens, usage), content_type="application/json")
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_event(_choice(chat, "x", None), chat))
        # Still generating after the first byte: the request is in flight until its last.
        await asyncio.sleep(self.hold_s + tokens * self.per_token_s)
        await resp.write(_event(_choice(chat, "y", "length"), chat))
        await resp.write(_event({"choices": [], "usage": usage}, chat))
        await resp.write(b"data: [DONE]\n\n")
        self.done.append((tenant, time.monotonic(), usage["total_tokens"]))
        await resp.write_eof()
        return resp


def _completion(text: str, usage: dict[str, int]) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
    return _body(("cmpl-engine", "text_completion"), choice, usage)


def _chat_completion(text: str, usage: dict[str, int]) -> bytes:
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length"}
    return _body(("chatcmpl-engine", "chat.completion"), choice, usage)


def _body(head: tuple[str, str], choice: dict[str, object], usage: dict[str, int]) -> bytes:
    answer = {"id": head[0], "object": head[1], "created": 1700000000, "model": "m", "choices": [choice]}
    return json.dumps(answer | {"usage": usage}).encode()


def _choice(chat: bool, text: str, finish: str | None) -> dict[str, object]:
    """A stream chunk's one choice: a completion's `text`, or a chat delta."""
    choice: dict[str, object] = {"index": 0, "logprobs": None, "finish_reason": finish}
    choice |= {"delta": {"role": "assistant", "content": text}} if chat else {"text": text}
    return {"choices": [choice]}


def _event(fields: dict[str, object], chat: bool = False) -> bytes:
    head = ("chatcmpl-engine", "chat.completion.chunk") if chat else ("cmpl-engine", "text_completion")
    chunk = {"id": head[0], "object": head[1], "created": 1700000000, "model": "m", **fields}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"
