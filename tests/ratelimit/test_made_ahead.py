"""A request alone makes its first upstream request while admission's call to Redis is out (`Job.prepare`),
so that the CPU of making it overlaps the round trip. What goes upstream and what the client gets must be
exactly what they are when the request is made after admission (limits decided in process, which never wait):
every body, path and answer, the parameters dropped, a retry on the same target, a refusal by the adapter.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from gateway.config import parse_config
from gateway.ops.metrics import Record
from gateway.path.dialects import OPENAI
from gateway.path.operation import CHAT, COMPLETIONS, Operation
from gateway.path.pipeline import Pipeline
from tests.helpers.recordings import fixture_bytes, sse_events
from tests.helpers.redis import RedisServer
from tests.helpers.upstreams import Received, Upstream, reply, reply_sse
from wire.errors import GatewayError

COMPLETION = fixture_bytes("openai/completion_davinci002.json")
COMPLETION_SSE = sse_events(fixture_bytes("openai/completion_stream_davinci002.sse.txt"))
CHAT_ANSWER = fixture_bytes("openai/chat_completion.json")
CHAT_SSE = sse_events(fixture_bytes("openai/chat_stream_tool_calls_parallel.sse.txt"))
HEADERS = {"authorization": "Bearer k-one"}
MODEL = "up/davinci-002"


def config(upstream: Upstream, redis: str | None) -> str:
    shared = f'redis: {{url: "{redis}", on_failure: fail_closed}}\n' if redis else ""
    return f"""{shared}unsupported_params: drop
retries: {{same_target: 1}}
keys:
  - {{name: one, key: k-one, limits: {{rpm: 100000, tpm: 100000000}}}}
providers:
  up: {{kind: openai, api_key: sk-up, base_url: "{upstream.url}/v1"}}
"""


def answering(fail_first: list[bool]) -> Callable[[web.Request, Received], Awaitable[web.StreamResponse]]:
    """The recorded answer of each route, plain or streamed; a 500 first when `fail_first` holds True."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        if fail_first and fail_first.pop():
            return await reply(b'{"error": {"message": "boom", "type": "server_error"}}', 500)(request, received)
        chat = received.path.endswith("/chat/completions")
        if json.loads(received.body).get("stream"):
            return await reply_sse(CHAT_SSE if chat else COMPLETION_SSE)(request, received)
        return await reply(CHAT_ANSWER if chat else COMPLETION)(request, received)

    return handler


@pytest.fixture
async def pipelines(rds: RedisServer, upstream: Upstream) -> AsyncIterator[tuple[Pipeline, Pipeline]]:
    """(limits in Redis: made ahead; the same limits in process: made after)."""
    made = [Pipeline(parse_config(config(upstream, url), "ahead.yaml", env={})) for url in (rds.url, None)]
    try:
        yield made[0], made[1]
    finally:
        for p in made:
            await p.close()


async def served(p: Pipeline, body: dict[str, Any], op: Operation = COMPLETIONS) -> tuple[int, dict[str, str], bytes]:
    """One request as the endpoint makes it: the answer's status, headers and bytes (a stream read whole)."""
    try:
        result = await p.complete(json.dumps(body).encode(), HEADERS, OPENAI, op=op)
    except GatewayError as exc:
        status, text = OPENAI.error(exc)
        return status, {}, text
    if result.stream is None:
        return 200, result.headers, result.body
    return 200, result.headers, b"".join([chunk async for chunk in result.stream])


def comparable(answer: bytes) -> Any:
    """An answer without what differs per request: ids and creation times."""
    events = [e for e in answer.split(b"\n\n") if e] if answer.startswith(b"data: ") else [answer]
    out = []
    for event in events:
        data = event.removeprefix(b"data: ")
        if data == b"[DONE]":
            out.append("[DONE]")
            continue
        doc = json.loads(data)
        if isinstance(doc, dict):
            doc.pop("id", None)
            doc.pop("created", None)
        out.append(doc)
    return out


REQUESTS: list[tuple[Operation, dict[str, Any]]] = [
    (COMPLETIONS, {"model": MODEL, "prompt": "Say this is a test", "max_tokens": 7, "stop": ["\n"]}),
    (COMPLETIONS, {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 7, "logprobs": 2, "echo": True}),
    (COMPLETIONS, {"model": MODEL, "prompt": "Say this is a test", "top_k": 5}),  # dropped for OpenAI
    (COMPLETIONS, {"model": MODEL, "prompt": "Say this", "stream": True, "stream_options": {"include_usage": True}}),
    (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 9}),
    (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}),
]


@pytest.mark.parametrize("fail_first", [False, True], ids=["first-try", "retried"])
async def test_upstream_and_client_see_the_same_whether_made_ahead_or_after(
    pipelines: tuple[Pipeline, Pipeline], upstream: Upstream, fail_first: bool
) -> None:
    ahead, after = pipelines
    for op, body in REQUESTS:
        seen: list[list[Received]] = []
        answers = []
        for p in (ahead, after):
            upstream.received = []
            upstream.handler = answering([True] if fail_first else [])
            answers.append(await served(p, body, op))
            seen.append(upstream.received)
        (status_a, headers_a, bytes_a), (status_b, headers_b, bytes_b) = answers
        assert status_a == status_b == 200, (body, bytes_a, bytes_b)
        assert comparable(bytes_a) == comparable(bytes_b), body
        assert headers_a.get("x-gateway-dropped-params") == headers_b.get("x-gateway-dropped-params")
        assert headers_a["x-gateway-attempts"] == headers_b["x-gateway-attempts"] == ("2" if fail_first else "1")
        # A retry on the same target makes its request anew, byte for byte the one made ahead.
        assert len(seen[0]) == len(seen[1]) == (2 if fail_first else 1)
        for a, b in zip(seen[0], seen[1], strict=True):
            assert (a.method, a.path, a.body) == (b.method, b.path, b.body)
            assert a.headers["authorization"] == b.headers["authorization"] == "Bearer sk-up"


async def test_a_dropped_parameter_is_reported_when_made_ahead(
    pipelines: tuple[Pipeline, Pipeline], upstream: Upstream
) -> None:
    ahead, _ = pipelines
    upstream.received = []
    upstream.handler = answering([])
    status, headers, _ = await served(ahead, {"model": MODEL, "prompt": "x", "top_k": 5})
    assert status == 200
    assert headers["x-gateway-dropped-params"] == "top_k"
    assert "top_k" not in json.loads(upstream.received[0].body)


async def test_a_request_the_adapter_refuses_is_refused_as_before_and_nothing_is_sent(
    pipelines: tuple[Pipeline, Pipeline], upstream: Upstream
) -> None:
    upstream.received = []
    upstream.handler = answering([])
    for p in pipelines:
        status, _, body = await served(p, {"model": MODEL, "prompt": "x", "logprobs": 6})
        assert status == 400, body
        assert json.loads(body)["error"]["param"] == "logprobs"
    assert upstream.received == []


async def admitted(p: Pipeline, body: dict[str, Any]) -> Any:
    rec = Record(request_id="", dialect="openai")
    return await p._admit(json.dumps(body).encode(), HEADERS, rec, None, COMPLETIONS)


async def test_the_request_is_made_during_admission_only_when_it_waits_on_redis_alone(
    pipelines: tuple[Pipeline, Pipeline],
) -> None:
    ahead, after = pipelines
    body = {"model": MODEL, "prompt": "Say this is a test", "max_tokens": 7}
    job = await admitted(ahead, body)
    assert job.ticket is not None and job.ahead is not None
    route = job.plan.single
    assert job.ahead[0] is route
    assert json.loads(job.ahead[1].body)["prompt"] == "Say this is a test"
    request = job.ahead[1]
    assert job.made(route) is request
    assert job.made(route) is None  # once: a second attempt there makes its own
    # Decided in process, nothing is waited for: nothing to overlap.
    assert (await admitted(after, body)).ahead is None
    # Not alone: the loop has other requests' work for the wait.
    ahead.enter()
    ahead.enter()
    try:
        assert (await admitted(ahead, body)).ahead is None
    finally:
        ahead.exit()
        ahead.exit()
