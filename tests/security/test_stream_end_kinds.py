"""Kinds whose streams end at a last event that carries content (its finish reason, its usage), not at an end
marker: Ollama's line with `done: true`, TGI's event with `generated_text`, Bedrock's `metadata`, Cohere's
`message-end`, llama.cpp's last completion's `stop: true`. An upstream that sends it and then keeps its body
open, or sends more after it.

The gateway read on until the upstream closed the body (here after its 5 s hold; the read timeout, 120 s by
default, for one that never closes it), and what came after the last event was relayed. The last event now
ends the answer: its content is relayed, nothing after it is read, and the client's stream ends at once.

Over real sockets: the gateway served by uvicorn, one aiohttp loopback upstream replaying the recorded streams
(tests/fixtures, SOURCES.md; llama.cpp's, of which none is recorded, built as its server code writes them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.helpers.clients import sse_data
from tests.helpers.eventstream import event
from tests.helpers.recordings import fixture_bytes, sse_events
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Handler, Upstream, reply_sse, reply_stream
from tests.providers.test_bedrock_response import RECORDED_TEXT

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
providers:
  ol: {{kind: ollama, base_url: "{u}"}}
  tg: {{kind: tgi, base_url: "{u}"}}
  aws: {{kind: bedrock, region: us-east-1, api_key: ABSKQmVkcm9ja0FQSUtleS1leGFtcGxl, base_url: "{u}"}}
  co: {{kind: cohere, api_key: co-test-0000000000, base_url: "{u}"}}
  ll: {{kind: llamacpp, base_url: "{u}"}}
  lln: {{kind: llamacpp, base_url: "{u}", max_n: 2}}
"""

HOLD_S = 5.0  # well past the test's bound, well within the client's timeout
CHAT = {"messages": [{"role": "user", "content": "p"}]}


def ollama() -> Handler:
    after = b'{"model":"llama3","created_at":"2024-05-24T20:48:38.5Z","response":" AFTER","done":false}\n'
    return reply_stream([fixture_bytes("ollama/generate_stream.ndjson"), after], "application/x-ndjson", hold_s=HOLD_S)


def tgi() -> Handler:
    after = b'data:{"index":2,"token":{"id":5,"text":" AFTER","logprob":-1.0,"special":false},"generated_text":null}'
    return reply_sse([*sse_events(fixture_bytes("tgi/generate_stream_details.sse.txt")), after], hold_s=HOLD_S)


def bedrock() -> Handler:
    after = event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": " AFTER"}, "p": "abcd"})
    recorded = fixture_bytes("bedrock/converse_stream.eventstream")
    return reply_stream([recorded, after], "application/vnd.amazon.eventstream", hold_s=HOLD_S)


def cohere() -> Handler:
    delta = {"type": "content-delta", "index": 0, "delta": {"message": {"content": {"text": " AFTER"}}}}
    after = b"event: content-delta\ndata: " + json.dumps(delta).encode()
    return reply_sse([*sse_events(fixture_bytes("cohere/v2_chat_stream_text.sse.txt")), after], hold_s=HOLD_S)


# llama-server's native /completion stream as its code writes it (no stream of it is recorded): each result
# `data: <json>` and a blank line (format_oai_sse, tools/server/server-common.cpp); a token's partial result and
# each completion's final one with `stop: true`, its counts and an empty content in a stream
# (`server_task_result_cmpl_{partial,final}::to_json_non_oaicompat`, tools/server/server-task.cpp at
# 17f5f8a80d8ac9c18c23ecb2321640daeec77096; `send_final_response`, tools/server/server-context.cpp at
# 001d906a6d86e2490e394361e7cc6f478b100088). It sends nothing after the last completion's final result.
def _partial(index: int, content: str, token: int, predicted: int) -> dict[str, Any]:
    fields = {"index": index, "content": content, "tokens": [token], "stop": False, "id_slot": index}
    return fields | {"tokens_predicted": predicted, "tokens_evaluated": 6}


def _final(index: int, stop_type: str, predicted: int) -> dict[str, Any]:
    timings = {"cache_n": 0, "prompt_n": 6, "prompt_ms": 12.5, "prompt_per_token_ms": 2.08}
    timings |= {"prompt_per_second": 480.0, "predicted_n": predicted, "predicted_ms": 30.0}
    timings |= {"predicted_per_token_ms": 30.0 / predicted, "predicted_per_second": predicted / 0.03}
    return {
        "index": index,
        "content": "",
        "tokens": [],
        "id_slot": index,
        "stop": True,
        "model": "m",
        "tokens_predicted": predicted,
        "tokens_evaluated": 6,
        "generation_settings": {"n_predict": 2, "temperature": 0.8, "seed": 4294967295, "stream": True},
        "prompt": "<s> The capital of France is",
        "has_new_line": False,
        "truncated": False,
        "stop_type": stop_type,
        "stopping_word": "",
        "tokens_cached": 6 + predicted - 1,
        "timings": timings,
    }


def llamacpp(results: list[dict[str, Any]]) -> Handler:
    after = _partial(0, " AFTER", 5, 3)
    return reply_sse([b"data: " + json.dumps(r).encode() for r in [*results, after]], hold_s=HOLD_S)


# One completion: " Paris", "." and its final result (the token limit).
LLAMA_ONE = [_partial(0, " Paris", 3681, 1), _partial(0, ".", 29889, 2), _final(0, "limit", 2)]
# `n_cmpl` 2, one slot each: their results interleaved, each completion's final result its own; the second to
# end is the stream's last.
LLAMA_TWO = [
    _partial(0, " A", 319, 1),
    _partial(1, " B", 350, 1),
    _final(1, "eos", 1),
    _partial(0, " C", 315, 2),
    _final(0, "limit", 2),
]


def _ollama_text() -> str:
    lines = fixture_bytes("ollama/generate_stream.ndjson").splitlines()
    return "".join(json.loads(line)["response"] for line in lines)


@dataclass(frozen=True)
class Case:
    path: str
    model: str
    fields: dict[str, Any]
    upstream: Handler
    text: str  # what the client is told, every piece of it
    finish: str
    usage: tuple[int, int, int]  # prompt, completion, total: the last event's


CASES: dict[str, Case] = {
    # The recording's last line: done_reason stop, prompt_eval_count 17; 71 lines of text.
    "ollama-completions": Case(
        "/v1/completions", "ol/llama3", {"prompt": "p"}, ollama(), _ollama_text(), "stop", (17, 71, 88)
    ),
    # The recording is one event, the last: a one-token answer (" "), details.finish_reason length.
    "tgi-completions": Case("/v1/completions", "tg/m", {"prompt": "p"}, tgi(), " ", "length", (0, 1, 1)),
    # messageStop (end_turn), then metadata with the usage.
    "bedrock-completions": Case(
        "/v1/completions", "aws/amazon.nova-micro-v1:0", {"prompt": "p"}, bedrock(), RECORDED_TEXT, "stop", (13, 82, 95)
    ),
    "bedrock-chat": Case(
        "/v1/chat/completions", "aws/amazon.nova-micro-v1:0", CHAT, bedrock(), RECORDED_TEXT, "stop", (13, 82, 95)
    ),
    # message-end: MAX_TOKENS, billed units 20 in, 4 out.
    "cohere-completions": Case(
        "/v1/completions", "co/command-r", {"prompt": "p"}, cohere(), "Coca-Cola", "length", (20, 4, 24)
    ),
    "cohere-chat": Case("/v1/chat/completions", "co/command-r", CHAT, cohere(), "Coca-Cola", "length", (20, 4, 24)),
    # The final result: stop_type limit, 6 prompt tokens, 2 predicted.
    "llamacpp-completions": Case(
        "/v1/completions", "ll/m", {"prompt": "p"}, llamacpp(LLAMA_ONE), " Paris.", "length", (6, 2, 8)
    ),
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("stream-end-kinds"), CONFIG.format(u=upstream.url)) as gw:
        yield gw


@pytest.mark.parametrize("name", list(CASES))
def test_the_last_event_ends_the_clients_stream_with_its_content(
    gateway: GatewayThread, upstream: Upstream, name: str
) -> None:
    case = CASES[name]
    upstream.handler = case.upstream
    body = {"model": case.model, "stream": True, "stream_options": {"include_usage": True}, **case.fields}
    chunks = _streamed(gateway, case.path, body)
    choices = [c for chunk in chunks for c in chunk["choices"]]
    said = "".join(c.get("text") or (c.get("delta") or {}).get("content") or "" for c in choices)
    assert said == case.text
    assert [c["finish_reason"] for c in choices if c.get("finish_reason")] == [case.finish]
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage is not None
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == case.usage


def test_llamacpp_ends_at_the_last_of_its_completions(gateway: GatewayThread, upstream: Upstream) -> None:
    # `n` 2 in one call (`max_n`): the first completion's final result is not the end, the second's is.
    upstream.handler = llamacpp(LLAMA_TWO)
    body = {"model": "lln/m", "prompt": "p", "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    chunks = _streamed(gateway, "/v1/completions", body)
    choices = [c for chunk in chunks for c in chunk["choices"]]
    texts = {i: "".join(c["text"] for c in choices if c["index"] == i) for i in (0, 1)}
    assert texts == {0: " A C", 1: " B"}
    assert {c["index"]: c["finish_reason"] for c in choices if c["finish_reason"]} == {0: "length", 1: "stop"}
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage is not None
    # The prompt once, both completions' tokens.
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (6, 3, 9)


def test_llamacpp_ends_each_call_of_a_fanned_out_n_at_its_completion(
    gateway: GatewayThread, upstream: Upstream
) -> None:
    # No `max_n`: the gateway asks for each of `n` in a call of its own, whose one completion's final result ends it.
    upstream.handler = llamacpp(LLAMA_ONE)
    body = {"model": "ll/m", "prompt": "p", "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    chunks = _streamed(gateway, "/v1/completions", body)
    choices = [c for chunk in chunks for c in chunk["choices"]]
    assert {i: "".join(c["text"] for c in choices if c["index"] == i) for i in (0, 1)} == {0: " Paris.", 1: " Paris."}
    assert {c["index"]: c["finish_reason"] for c in choices if c["finish_reason"]} == {0: "length", 1: "length"}
    usage = chunks[-1]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        12,
        4,
        16,
    )  # each call evaluates the prompt: the calls' usage added


def _streamed(gateway: GatewayThread, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The client's stream of `body`, checked to end promptly with `[DONE]` and nothing sent after the upstream's
    last event: its chunks."""
    started = time.monotonic()
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as client:
        resp = client.post(path, json=body)
    assert time.monotonic() - started < 3  # not the upstream's hold (HOLD_S), nor the read timeout
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    assert "AFTER" not in resp.text and "error" not in resp.text
    return [json.loads(d) for d in data[:-1]]
