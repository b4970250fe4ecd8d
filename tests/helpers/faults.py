"""Fault-injecting loopback upstreams: scripted OpenAI-compatible targets that misbehave on cue.

One real aiohttp server on 127.0.0.1 (`tests.helpers.upstreams.Upstream`, in its own thread and loop) serves
any number of OpenAI-compatible *targets*, each under its own path prefix (`/<name>/v1/completions`).
Every target is scripted per test: a queue of behaviours, one per request it receives, then a default
(a good answer). Every request is recorded (target, arrival time, body, whether the peer hung up), both
on the target and in one journal shared by all targets, so a test can assert the exact order of
attempts across targets.

Good answers are the real recordings in tests/fixtures/openai (see tests/fixtures/SOURCES.md):
`completion_davinci002.json` (with its recorded headers) and `completion_stream_davinci002.sse.txt`
(16 content chunks, then `data: [DONE]`), replayed byte for byte. Error bodies reuse the envelope of the
one recorded OpenAI error (`error_400_model_not_found.json`) with the message, type and code OpenAI
documents for each case; the usage chunk a stream ends with when `stream_options.include_usage` is set
(absent from the recording, which did not ask for it) is built from the recording's own id, created and
model in OpenAI's documented shape (`"choices": []` plus `usage`). Those synthesized bodies are marked
where they are built.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

from tests.helpers.recordings import fixture_bytes, fixture_headers, fixture_json, sse_events
from tests.helpers.servers import Running
from tests.helpers.upstreams import Received, Upstream

RECORDED_JSON: Final = fixture_bytes("openai/completion_davinci002.json")
RECORDED_HEADERS: Final = fixture_headers("openai/completion_davinci002.headers.json")
RECORDED_SSE: Final = fixture_bytes("openai/completion_stream_davinci002.sse.txt")
_EVENTS: Final = sse_events(RECORDED_SSE)
# The 16 content chunks of the recorded stream (each `data: {...}` without its blank line), and its end.
CHUNKS: Final = _EVENTS[:-1]
DONE_EVENT: Final = _EVENTS[-1]
assert DONE_EVENT == b"data: [DONE]" and len(CHUNKS) == 16
RECORDED_TEXTS: Final[list[str]] = [json.loads(e[len(b"data: ") :])["choices"][0]["text"] for e in CHUNKS]
RECORDED_STREAM_TEXT: Final = "".join(RECORDED_TEXTS)
RECORDED_COMPLETION: Final[dict[str, Any]] = json.loads(RECORDED_JSON)
RECORDED_400: Final = fixture_bytes("openai/error_400_model_not_found.json")


def openai_error(message: str, type: str, code: str | None, param: str | None = None) -> bytes:
    """An error body in the recorded OpenAI envelope's shape, with this case's message, type and code."""
    body: dict[str, Any] = fixture_json("openai/error_400_model_not_found.json")
    body["error"].update(message=message, type=type, code=code, param=param)
    return json.dumps(body).encode()


# Synthesized in the recorded envelope: the messages, types and codes OpenAI documents for these cases.
RATE_LIMIT_BODY: Final = openai_error(
    "Rate limit reached for davinci-002 on requests per min (RPM): Limit 3, Used 3, Requested 1.",
    "requests",
    "rate_limit_exceeded",
)
OVERLOADED_BODY: Final = openai_error("The server is overloaded or not ready yet.", "server_error", None)
SERVER_ERROR_BODY: Final = openai_error("The server had an error while processing your request.", "server_error", None)
QUOTA_BODY: Final = openai_error(
    "You exceeded your current quota, please check your plan and billing details.",
    "insufficient_quota",
    "insufficient_quota",
)
CONTEXT_BODY: Final = openai_error(
    "This model's maximum context length is 16385 tokens, however you requested 17000 tokens "
    "(16984 in your prompt; 16 for the completion). Please reduce your prompt; or completion length.",
    "invalid_request_error",
    "context_length_exceeded",
    "prompt",
)


def usage_event(prompt_tokens: int, completion_tokens: int) -> bytes:
    """The final `include_usage` chunk (synthesized from the recording's id/created/model, OpenAI's shape)."""
    first = json.loads(CHUNKS[0][len(b"data: ") :])
    chunk = {
        "id": first["id"],
        "object": "text_completion",
        "created": first["created"],
        "choices": [],
        "model": first["model"],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode()


# --------------------------------------------------------------------------------------------------
# What one target does with one request


@dataclass
class Hit:
    """One request as a target received it."""

    target: str
    index: int  # 0-based, per target
    at: float  # time.monotonic() on arrival
    body: bytes
    headers: dict[str, str]
    # Set when the peer (the gateway) hung up before the behaviour finished answering, and when.
    disconnected: threading.Event = field(default_factory=threading.Event)
    disconnected_at: float | None = None

    def json(self) -> Any:
        return json.loads(self.body)


Behaviour = Callable[[web.Request, Hit], Awaitable[web.StreamResponse]]


def respond(body: bytes, status: int = 200, headers: Mapping[str, str] | None = None) -> Behaviour:
    """Answer one body (JSON) with this status and these extra headers."""
    hdrs = {"content-type": "application/json", **{k.lower(): v for k, v in (headers or {}).items()}}

    async def behave(request: web.Request, hit: Hit) -> web.StreamResponse:
        return web.Response(body=body, status=status, headers=hdrs)

    return behave


def stream(
    chunks: Sequence[bytes] = CHUNKS,
    *,
    usage: tuple[int, int] | None = None,
    first_delay: float = 0.0,
    gap: float = 0.0,
    written: threading.Event | None = None,
) -> Behaviour:
    """Stream these recorded events (after `first_delay`, `gap` between them), an optional usage chunk, [DONE].
    `written` is set once the first event is handed to the socket."""

    async def behave(request: web.Request, hit: Hit) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        if first_delay:
            await asyncio.sleep(first_delay)
        for i, event in enumerate(chunks):
            if i and gap:
                await asyncio.sleep(gap)
            await resp.write(event + b"\n\n")
            if written is not None:
                written.set()
        if usage is not None:
            await resp.write(usage_event(*usage) + b"\n\n")
        await resp.write(DONE_EVENT + b"\n\n")
        await resp.write_eof()
        return resp

    return behave


def good() -> Behaviour:
    """What the recorded OpenAI answered: the JSON completion (with its headers) or the SSE stream."""
    plain = respond(RECORDED_JSON, headers=RECORDED_HEADERS)
    streamed = stream()

    async def behave(request: web.Request, hit: Hit) -> web.StreamResponse:
        return await (streamed if hit.json().get("stream") else plain)(request, hit)

    return behave


def continuation(prompt_tokens: int) -> Behaviour:
    """A stream that continues the recording: the last `max_tokens` recorded chunks, then their usage.

    Asked to continue after K chunks (max_tokens = 16 - K), it streams chunks K..15, so the client of a
    resumed stream sees exactly the recorded stream; its usage counts the prompt it was sent.
    """

    async def behave(request: web.Request, hit: Hit) -> web.StreamResponse:
        left = int(hit.json()["max_tokens"])
        tail = CHUNKS[len(CHUNKS) - left :]
        return await stream(tail, usage=(prompt_tokens, len(tail)))(request, hit)

    return behave


def rate_limited(retry_after: str | None = None, retry_after_ms: str | None = None) -> Behaviour:
    headers = {"retry-after": retry_after, "retry-after-ms": retry_after_ms}
    return respond(RATE_LIMIT_BODY, 429, {k: v for k, v in headers.items() if v is not None})


def unavailable(retry_after: str | None = None, should_retry: str | None = None) -> Behaviour:
    headers = {"retry-after": retry_after, "x-should-retry": should_retry}
    return respond(OVERLOADED_BODY, 503, {k: v for k, v in headers.items() if v is not None})


def server_error() -> Behaviour:
    return respond(SERVER_ERROR_BODY, 500)


def quota_exhausted() -> Behaviour:
    return respond(QUOTA_BODY, 429)


def context_too_long() -> Behaviour:
    return respond(CONTEXT_BODY, 400)


def bad_request(should_retry: str | None = None) -> Behaviour:
    """The recorded 400 (model not found) verbatim: the client's own mistake."""
    return respond(RECORDED_400, 400, {"x-should-retry": should_retry} if should_retry else None)


async def _until_cancelled(seconds: float = 20.0) -> web.StreamResponse:
    await asyncio.sleep(seconds)  # the gateway hangs up long before: the handler task is cancelled
    return web.Response(status=500, text="the gateway should have hung up long ago")


def reset() -> Behaviour:
    """Read the request, then drop the connection without a byte of answer (TCP RST)."""

    async def behave(request: web.Request, hit: Hit) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()
        return await _until_cancelled()

    return behave


def hang() -> Behaviour:
    """Never answer (not even the status line); the hit records when the gateway gives up."""

    async def behave(request: web.Request, hit: Hit) -> web.StreamResponse:
        return await _until_cancelled()

    return behave


def slow(seconds: float, then: Behaviour | None = None) -> Behaviour:
    """Say nothing for `seconds` (no status line: a slow first byte), then behave like `then`."""
    after = then or good()

    async def behave(request: web.Request, hit: Hit) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return await after(request, hit)

    return behave


def gated(go: threading.Event, then: Behaviour, timeout: float = 10.0) -> Behaviour:
    """Say nothing (no status line) until the test sets `go`, then behave like `then`: an answer timed by
    the test, not by a delay a loaded machine's scheduling could stretch past it."""

    async def behave(request: web.Request, hit: Hit) -> web.StreamResponse:
        deadline = time.monotonic() + timeout
        while not go.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        return await then(request, hit)

    return behave


def cut(after: int, settle: float = 0.05) -> Behaviour:
    """Stream the first `after` recorded chunks, then reset the connection mid-stream.

    `settle` lets the chunks already written reach the gateway before the reset (an RST may make the
    peer's kernel drop data it has not read yet).
    """

    async def behave(request: web.Request, hit: Hit) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for event in CHUNKS[:after]:
            await resp.write(event + b"\n\n")
        await asyncio.sleep(settle)
        assert request.transport is not None
        request.transport.abort()
        return await _until_cancelled()

    return behave


# --------------------------------------------------------------------------------------------------
# Targets and the server


class Target:
    """One scripted upstream at `<server>/<name>/v1`."""

    def __init__(self, server: FaultServer, name: str) -> None:
        self.server = server
        self.name = name
        self.queue: deque[Behaviour] = deque()
        self.default: Behaviour = good()
        self.hits: list[Hit] = []

    @property
    def base_url(self) -> str:
        return f"{self.server.url}/{self.name}/v1"

    def script(self, *behaviours: Behaviour, then: Behaviour | None = None) -> Target:
        """Answer the next requests with `behaviours`, one each, then with `then` (default: good)."""
        self.queue = deque(behaviours)
        self.default = then or good()
        return self

    @property
    def count(self) -> int:
        return len(self.hits)

    def bodies(self) -> list[Any]:
        return [h.json() for h in self.hits]

    async def handle(self, request: web.Request, received: Received) -> web.StreamResponse:
        hit = Hit(self.name, len(self.hits), time.monotonic(), received.body, received.headers)
        self.hits.append(hit)
        self.server.journal.append(hit)
        behave = self.queue.popleft() if self.queue else self.default
        try:
            return await behave(request, hit)
        except asyncio.CancelledError:
            hit.disconnected_at = time.monotonic()
            hit.disconnected.set()
            raise


class FaultServer(Running):
    """A loopback aiohttp server holding scripted targets; `journal` is every hit in arrival order."""

    def __init__(self) -> None:
        self._upstream = Upstream()
        self._upstream.handler = self._dispatch
        self.targets: dict[str, Target] = {}
        self.journal: list[Hit] = []

    @property
    def url(self) -> str:
        return self._upstream.url

    def start(self) -> None:
        self._upstream.start()

    def stop(self) -> None:
        self._upstream.stop()

    def __getitem__(self, name: str) -> Target:
        target = self.targets.get(name)
        if target is None:
            target = self.targets[name] = Target(self, name)
        return target

    def forget(self) -> None:
        """Every target unscripted, with no hits, and an empty journal: a module-scoped server between tests."""
        for target in self.targets.values():
            target.script()
            target.hits.clear()
        self.journal.clear()

    def order(self) -> list[str]:
        """Which target received each request, in arrival order."""
        return [h.target for h in self.journal]

    async def _dispatch(self, request: web.Request, received: Received) -> web.StreamResponse:
        name = received.path.strip("/").split("/", 1)[0]
        if received.path != f"/{name}/v1/completions":
            return web.Response(status=599, text=f"unexpected path {received.path}")
        return await self[name].handle(request, received)
