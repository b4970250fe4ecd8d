"""Streams: failover before the first event is invisible; after it, only `resume_streams` goes on.

docs/resilience.md, "Streams". The client's bytes are compared with what one good upstream produces
through the gateway (the recorded stream), the per-request completion id aside.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from aiohttp import web

from gateway.ops.metrics import Record
from gateway.path.dialects import OPENAI
from gateway.path.pipeline import Pipeline
from gateway.resilience.health import TargetState
from tests.helpers.faults import (
    CHUNKS,
    CONTEXT_BODY,
    RECORDED_COMPLETION,
    RECORDED_STREAM_TEXT,
    RECORDED_TEXTS,
    Behaviour,
    FaultServer,
    continuation,
    cut,
    hang,
    openai_error,
    reset,
    stream,
    unavailable,
)
from tests.helpers.pipelines import PROMPT, Answer, VirtualTime, ask, key, request_body, same_but_id, state
from tests.helpers.waiting import wait_for

from .conftest import MakePipeline, Reference

ORDERED = """
  - name: smart
    strategy: ordered
    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}, {model: gamma/davinci-002}]
"""
TOP = "retries: {attempts: 3}\ntimeouts: {connect_ms: 1000, first_byte_ms: 300, total_ms: 5000}\n"
RESUMING = ORDERED + "    resume_streams: true\n"
# A mid-stream failure reported as an event (synthesized in the recorded error envelope).
ERROR_EVENT = b"data: " + openai_error("The server had an error while processing your request.", "server_error", None)


async def streamed(p: Pipeline, **extra: Any) -> tuple[Record, list[str]]:
    """A streamed request through `p` (with `extra` fields) read to its end: what it recorded, and its SSE
    events as sent."""
    rec = Record(request_id="r-streamed", dialect="openai")
    result = await p.complete(request_body(stream=True, **extra), {}, OPENAI, rec)
    assert result.stream is not None
    body = b"".join([c async for c in result.stream]).decode()
    return rec, [e for e in body.split("\n\n") if e]


def assert_recorded_stream(answer: Answer) -> None:
    """The client got the recorded stream, chunk for chunk, under one gateway id."""
    chunks = answer.chunks()
    content = [c for c in chunks if c["choices"]]
    assert [c["choices"][0]["text"] for c in content] == RECORDED_TEXTS
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 15 + ["length"]
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["id"].startswith("cmpl-") and chunks[0]["id"] != json.loads(CHUNKS[0][6:])["id"]
    assert {c["model"] for c in chunks} == {"smart"}


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(unavailable(retry_after="9"), id="503"),
        pytest.param(reset(), id="reset-before-headers"),
        pytest.param(cut(0), id="reset-after-headers-before-first-event"),
        pytest.param(hang(), id="no-first-byte"),
        pytest.param(stream(first_delay=1.0), id="slow-first-event"),
    ],
)
async def test_failover_before_the_first_event_is_invisible(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference, fault: Behaviour
) -> None:
    faults["alpha"].script(fault)
    # Failing over at once (same_target 0): a dropped connection is otherwise retried on alpha first,
    # which is as invisible (test_same_target_retry_before_the_first_event_is_invisible).
    p = make(ORDERED, top=TOP.replace("attempts: 3", "attempts: 3, same_target: 0"))
    answer = await ask(p, stream=True)
    assert faults.order() == ["alpha", "beta"]
    assert vtime.sleeps == [0.0]
    assert answer.headers == {
        "x-gateway-provider": "beta",
        "x-gateway-model": key("beta"),
        "x-gateway-attempts": "2",
    }
    got, ids = same_but_id(answer.body)
    want, _ = same_but_id(reference.stream.body)
    assert got == want
    assert len(ids) == 1
    assert_recorded_stream(answer)


@pytest.mark.parametrize("usage", [None, (5, 0)], ids=["done-alone", "usage-then-done"])
async def test_a_stream_that_ends_before_its_first_event_fails_over(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference, usage: tuple[int, int] | None
) -> None:
    # 200, then only `data: [DONE]` (after the usage chunk, with `usage`): nothing was generated.
    faults["alpha"].script(stream([], usage=usage))
    p = make(ORDERED, top=TOP)
    answer = await ask(p, stream=True)
    assert faults.order() == ["alpha", "beta"]
    assert answer.served_by == key("beta")
    assert same_but_id(answer.body)[0] == same_but_id(reference.stream.body)[0]


@pytest.mark.parametrize("after", [1, 5])
async def test_a_stream_is_never_retried_after_its_first_byte(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, after: int
) -> None:
    faults["alpha"].script(cut(after))
    p = make(ORDERED, top=TOP)
    answer = await ask(p, stream=True)
    assert faults.order() == ["alpha"]  # beta and gamma were healthy, but bytes had been sent
    assert vtime.sleeps == []
    assert answer.headers["x-gateway-model"] == key("alpha")
    assert answer.headers["x-gateway-attempts"] == "1"
    events = answer.events()
    assert events[-1] == "[DONE]"
    assert [json.loads(e)["choices"][0]["text"] for e in events[:after]] == RECORDED_TEXTS[:after]
    assert json.loads(events[after]) == {
        "error": {
            "message": f"Upstream '{key('alpha')}' sent a truncated response",
            "type": "upstream_error",
            "param": None,
            "code": "upstream_truncated_response",
        }
    }
    assert len(events) == after + 2
    # The connection dropped: alpha is cooled like any dropped connection, so the next request skips it.
    assert (await p.health.snapshot([key("alpha")]))[key("alpha")] == TargetState(
        cooling_ms=1000, cause="error", failures=1
    )
    assert (await ask(p, stream=True)).served_by == key("beta")


async def test_a_stalled_stream_times_out_mid_way_and_is_not_retried(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(stream(gap=1.0))  # the first event at once, the second after 1 s > first_byte_ms
    p = make(ORDERED, top=TOP)
    answer = await ask(p, stream=True)
    events = answer.events()
    assert json.loads(events[0])["choices"][0]["text"] == RECORDED_TEXTS[0]
    assert json.loads(events[1])["error"]["type"] == "timeout_error"
    assert events[2:] == ["[DONE]"]
    assert faults.order() == ["alpha"]
    assert await wait_for(faults["alpha"].hits[0].disconnected, 2.0)  # the gateway let go of it


# --------------------------------------------------------------------------------------------------
# resume_streams


def comparable(chunks: list[Any]) -> list[Any]:
    """Chunks without what differs between two requests for one answer: the gateway's id, and the
    usage chunk's `created` (the gateway's own clock; content chunks carry the upstream's)."""
    return [{k: v for k, v in c.items() if k != "id" and (k != "created" or c["choices"])} for c in chunks]


@pytest.mark.parametrize(
    ("broken", "after"),
    [
        pytest.param(cut(5), 5, id="connection-lost"),
        pytest.param(stream(CHUNKS[:7] + [ERROR_EVENT]), 7, id="error-event"),
        pytest.param(stream(CHUNKS[:3]), 3, id="end-without-finish-reason"),
    ],
)
async def test_resumed_stream_is_one_uninterrupted_stream(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, broken: Behaviour, after: int
) -> None:
    # The reference: one good upstream streaming the recording with its usage (8 prompt + 16 completion).
    faults["omega"].script(stream(usage=(8, 16)))
    ref = make("  - name: smart\n    targets: [{model: omega/davinci-002}]\n", top=TOP)
    want = await ask(ref, stream=True, stream_options={"include_usage": True})
    faults.journal.clear()

    faults["alpha"].script(broken)
    # beta continues the recording; its prompt is the original plus what alpha streamed.
    faults["beta"].script(continuation(prompt_tokens=8 + after))
    p = make(RESUMING, top=TOP)
    answer = await ask(p, stream=True, stream_options={"include_usage": True})
    assert faults.order() == ["alpha", "beta"]
    # The continuation request: prompt + text so far, max_tokens reduced by the chunks sent.
    sent = faults["alpha"].hits[0].json()
    cont = faults["beta"].hits[0].json()
    assert cont == {
        **sent,
        "prompt": PROMPT + "".join(RECORDED_TEXTS[:after]),
        "max_tokens": 16 - after,
    }
    assert sent["prompt"] == PROMPT and sent["max_tokens"] == 16
    # One stream, same id throughout: byte for byte what the single good upstream produced.
    assert_recorded_stream(answer)
    chunks = answer.chunks()
    assert comparable(chunks) == comparable(want.chunks())
    got_bytes, _ = same_but_id(answer.body)
    want_bytes, _ = same_but_id(want.body)
    # Every content event is byte-identical; only the usage chunk's `created` (the gateway's clock) may differ.
    assert got_bytes.split(b"\n\n")[:16] == want_bytes.split(b"\n\n")[:16]
    # Usage adds up: beta's prompt included the `after` chunks already streamed, counted as output.
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24}, chunks[-3:]
    assert chunks[-1]["usage"] == RECORDED_COMPLETION["usage"]
    # The headers were sent with the first event: they name the target that started the stream.
    assert answer.headers["x-gateway-model"] == key("alpha")
    # A dropped connection cools the broken target at once; an error event or an early end is one piece of
    # evidence (docs/resilience.md, "Cooldowns"): one request's break is not enough to cool it.
    state = (await p.health.snapshot([key("alpha")]))[key("alpha")]
    if after == 5:  # connection-lost
        assert (state.cooling_ms, state.cause) == (1000, "error")
    else:
        assert state.cooling_ms == 0, state


# Error events a retry would get again: the request itself was refused (OpenAI's envelope; Azure answers a
# filtered prompt with a 400 of code `content_filter`).
REFUSED = {
    "context-length": CONTEXT_BODY,
    "invalid-request": openai_error("'logit_bias' is not valid here", "invalid_request_error", None),
    "content-filter": openai_error("The response was filtered by the content management policy.", "", "content_filter"),
}


@pytest.mark.parametrize("body", list(REFUSED.values()), ids=list(REFUSED))
async def test_a_stream_is_not_resumed_after_an_error_event_that_refuses_the_request(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, body: bytes
) -> None:
    # Its continuation would be refused too, wherever it went: the stream ends with the error, as it would
    # without resume_streams, booked as the 400 it is on the target that sent it.
    faults["alpha"].script(stream(CHUNKS[:7] + [b"data: " + body]))
    faults["beta"].script(continuation(prompt_tokens=15))
    p = make(RESUMING, top=TOP)
    rec, events = await streamed(p)
    assert faults.order() == ["alpha"]
    assert [json.loads(e[6:])["choices"][0]["text"] for e in events[:7]] == RECORDED_TEXTS[:7]
    error = json.loads(events[7][6:])["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"] == "upstream error (400): " + json.loads(body)["error"]["message"]
    assert events[8:] == ["data: [DONE]"]
    assert (rec.status, rec.cause, rec.target, rec.attempts) == (400, "http_400", key("alpha"), 1)
    assert rec.parts is None
    assert (await state(p, "alpha")).cooling_ms == 0  # the request's own doing: nothing against alpha


# Five stops: OpenAI takes four, so the gateway enforces them (docs/emulation.md), holding back text that may
# begin one. " python" (the recording's sixth chunk) may begin the fifth; " micro" shows it does not.
STOPS = ["Q:", "A:", "###", "END", " python script"]


@pytest.mark.parametrize(
    ("broken", "after", "relayed", "billed"),
    [
        # Six chunks streamed, the sixth held back when alpha dropped: the client had five, the continuation
        # goes on from them (the held text was never sent: it is generated anew, not lost nor repeated). Alpha
        # generated six, and its part of the spend counts six.
        pytest.param(cut(6), 5, 5, 6, id="held-at-the-break"),
        # Eight chunks streamed: the held sixth went out with the seventh, one chunk for two tokens.
        pytest.param(cut(8), 8, 7, 8, id="held-then-sent"),
    ],
)
async def test_a_resumed_stream_counts_the_tokens_its_stop_scanner_held_back(
    make: MakePipeline,
    faults: FaultServer,
    vtime: VirtualTime,
    broken: Behaviour,
    after: int,
    relayed: int,
    billed: int,
) -> None:
    faults["alpha"].script(broken)
    faults["beta"].script(continuation(prompt_tokens=8 + after))
    p = make(RESUMING, top=TOP)
    rec, events = await streamed(p, stop=STOPS)
    assert faults.order() == ["alpha", "beta"]
    assert faults["alpha"].hits[0].json()["stop"] == STOPS[:4]
    cont = faults["beta"].hits[0].json()
    assert (cont["prompt"], cont["max_tokens"]) == (PROMPT + "".join(RECORDED_TEXTS[:after]), 16 - after)
    texts = [json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]]
    assert "".join(texts[:relayed]) == "".join(RECORDED_TEXTS[:after])
    # The whole answer once, within max_tokens: nothing the client got is asked for again.
    assert "".join(texts) == RECORDED_STREAM_TEXT and events[-1] == "data: [DONE]"
    assert rec.parts is not None and [(t, n) for t, _, n in rec.parts] == [(key("alpha"), billed)]
    # What the client is told it got: the chunks it had from alpha, then the continuation's.
    assert rec.usage is not None and rec.usage.completion_tokens == after + (16 - after)


async def test_a_broken_stream_not_resumed_is_charged_what_its_stops_held_back(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # Six chunks streamed, the sixth held back when alpha dropped, no resume: the client got five and the error
    # event; the request is charged the six alpha generated (no usage came: estimated, a token per chunk).
    faults["alpha"].script(cut(6))
    p = make(ORDERED, top=TOP)
    rec, events = await streamed(p, stop=STOPS)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == "".join(RECORDED_TEXTS[:5])
    assert "error" in chunks[-1] and events[-1] == "data: [DONE]"
    assert rec.usage is not None and rec.usage_estimated and rec.usage.completion_tokens == 6


async def test_resume_fails_over_again_before_the_continuations_first_event(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(cut(4))
    faults["beta"].script(unavailable())
    faults["gamma"].script(continuation(prompt_tokens=12))
    p = make(RESUMING, top=TOP.replace("attempts: 3", "attempts: 3, same_target: 0"))
    answer = await ask(p, stream=True)
    assert faults.order() == ["alpha", "beta", "gamma"]
    assert faults["gamma"].hits[0].json()["prompt"] == faults["beta"].hits[0].json()["prompt"]
    assert faults["gamma"].hits[0].json()["max_tokens"] == 12
    assert_recorded_stream(answer)


async def test_resume_retries_the_continuations_target_before_its_first_event(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # The default same_target: 1: the continuation's 503 is retried on beta, which then continues.
    faults["alpha"].script(cut(4))
    faults["beta"].script(unavailable(), continuation(prompt_tokens=12))
    p = make(RESUMING, top=TOP)
    answer = await ask(p, stream=True)
    assert faults.order() == ["alpha", "beta", "beta"]
    assert faults["beta"].hits[1].json()["prompt"] == faults["beta"].hits[0].json()["prompt"]
    assert faults["beta"].hits[1].json()["max_tokens"] == 12
    assert faults["gamma"].count == 0
    assert_recorded_stream(answer)


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(unavailable(), id="503"),
        pytest.param(reset(), id="reset-before-headers"),
        pytest.param(cut(0), id="reset-after-headers-before-first-event"),
    ],
)
async def test_same_target_retry_before_the_first_event_is_invisible(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, reference: Reference, fault: Behaviour
) -> None:
    faults["alpha"].script(fault)
    p = make(ORDERED, top=TOP)
    answer = await ask(p, stream=True)
    assert faults.order() == ["alpha", "alpha"]
    assert answer.headers == {
        "x-gateway-provider": "alpha",
        "x-gateway-model": key("alpha"),
        "x-gateway-attempts": "2",
    }
    got, ids = same_but_id(answer.body)
    assert got == same_but_id(reference.stream.body)[0] and len(ids) == 1
    assert_recorded_stream(answer)


async def test_without_resume_streams_a_break_is_an_error_event_then_done(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(stream(CHUNKS[:7] + [ERROR_EVENT]))
    p = make(ORDERED, top=TOP)
    answer = await ask(p, stream=True)
    events = answer.events()
    assert [json.loads(e)["choices"][0]["text"] for e in events[:7]] == RECORDED_TEXTS[:7]
    assert json.loads(events[7]) == {
        "error": {
            "message": "upstream error (500): The server had an error while processing your request.",
            "type": "upstream_error",
            "param": None,
            "code": "server_error",
        }
    }
    assert events[8:] == ["[DONE]"]
    assert faults.order() == ["alpha"]


async def test_a_stream_that_cannot_be_resumed_is_not(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(cut(2))
    p = make(RESUMING, top=TOP)
    answer = await ask(p, stream=True, n=2)  # two choices cannot be continued by appending one text
    events = answer.events()
    assert json.loads(events[-2])["error"]["code"] == "upstream_truncated_response"
    assert events[-1] == "[DONE]"
    assert faults.order() == ["alpha"]


@pytest.mark.parametrize("config", [ORDERED, RESUMING], ids=["plain", "resuming"])
async def test_a_stream_whose_choices_all_finished_is_whole_when_the_connection_drops_before_done(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime, config: str
) -> None:
    # Every chunk, the last with its finish reason, then the connection reset before [DONE]: the answer is
    # complete. Not an error event after it, not a continuation adding text after the finish.
    faults["alpha"].script(cut(16))
    faults["beta"].script(continuation(prompt_tokens=13))
    p = make(config, top=TOP)
    rec, events = await streamed(p)
    assert [json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]] == RECORDED_TEXTS
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length" and events[-1] == "data: [DONE]"
    assert faults.order() == ["alpha"]
    assert (rec.status, rec.cause, rec.target) == (200, None, "alpha/davinci-002")
    assert (await state(p, "alpha")).cooling_ms == 0


async def test_a_resumed_streams_continuation_counts_in_its_attempts(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    faults["alpha"].script(cut(5))
    faults["beta"].script(continuation(prompt_tokens=13))
    p = make(RESUMING, top=TOP)
    rec, _ = await streamed(p)
    assert faults.order() == ["alpha", "beta"] and rec.attempts == 2 and rec.status == 200


async def test_a_continuation_has_what_is_left_of_the_requests_deadline(
    make: MakePipeline, faults: FaultServer
) -> None:
    # 1.2 s for the whole request (its inference_timeout, under total_ms 1.5 s): alpha streams five chunks
    # over a second and drops; beta would take 1.1 s more. The continuation has the 0.2 s left, not 1.5 s anew.
    async def slow_cut(request: web.Request, hit: Any) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for event in CHUNKS[:5]:
            await resp.write(event + b"\n\n")
            await asyncio.sleep(0.2)
        assert request.transport is not None
        request.transport.abort()
        await asyncio.sleep(20)
        return resp

    faults["alpha"].script(slow_cut)
    faults["beta"].script(stream(CHUNKS[5:], gap=0.1))
    top = "retries: {attempts: 3}\ntimeouts: {connect_ms: 1000, first_byte_ms: 1000, total_ms: 1500}\n"
    p = make(RESUMING, top=top, time=VirtualTime(follow_wall=True))
    began = time.monotonic()
    answer = await ask(p, stream=True, inference_timeout=1.2)
    took = time.monotonic() - began
    events = answer.events()
    assert took < 1.6, took
    assert "error" in json.loads(events[-2]) and events[-1] == "[DONE]"
    texts = [json.loads(e)["choices"][0]["text"] for e in events[:-2]]
    assert texts == RECORDED_TEXTS[: len(texts)] and len(texts) < len(RECORDED_TEXTS)


async def test_an_event_over_the_cap_mid_stream_is_a_failure_with_its_cause(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # Counted in gateway_upstream_failures_total (which counts a failure by its cause), booked on its target.
    big = json.loads(CHUNKS[3][len(b"data: ") :])
    big["choices"][0]["text"] = "a" * 3000
    faults["alpha"].script(stream([*CHUNKS[:3], b"data: " + json.dumps(big).encode(), *CHUNKS[4:]]))
    p = make(ORDERED, top=TOP + "caps: {upstream_event_bytes: 1024}\n")
    rec, events = await streamed(p)
    assert json.loads(events[-2][6:])["error"]["code"] == "upstream_event_too_large"
    assert (rec.status, rec.cause, rec.target) == (502, "answer_too_large", "alpha/davinci-002")


async def test_a_resumed_streams_parts_are_priced_at_the_targets_that_streamed_them(
    make: MakePipeline, faults: FaultServer, vtime: VirtualTime
) -> None:
    # alpha streams 5 tokens at 1 $/M, beta the other 11 at 100 $/M, sent the prompt and those 5 (13 tokens).
    faults["alpha"].script(cut(5))
    faults["beta"].script(continuation(prompt_tokens=8 + 5))
    prices = 'prices:\n  "alpha/*": {prompt_per_1m: 1, completion_per_1m: 1}\n'
    prices += '  "beta/*": {prompt_per_1m: 100, completion_per_1m: 100}\n'
    p = make(RESUMING, top=TOP + prices)
    rec, _ = await streamed(p)
    p.usage.book(rec)
    assert rec.usage is not None and (rec.usage.prompt_tokens, rec.usage.completion_tokens) == (8, 16)
    assert rec.target == "beta/davinci-002" and rec.parts is not None
    ((broke, prompt, sent),) = rec.parts
    assert (broke, sent) == ("alpha/davinci-002", 5) and prompt > 0
    cost = p.usage.prices.cost_pico
    assert rec.cost_pico == cost("alpha/davinci-002", "smart", prompt, 5) + cost("beta/davinci-002", "smart", 13, 11)
    assert rec.cost_pico != cost("alpha/davinci-002", "smart", 8, 16)  # all at the broken target's price
