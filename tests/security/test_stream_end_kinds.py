"""Kinds whose streams end at a last event that carries content (its finish reason, its usage), not at an end
marker: Ollama's line with `done: true`, TGI's event with `generated_text`, Bedrock's `metadata`, Cohere's
`message-end`. An upstream that sends that event and then keeps its body open, or sends more after it.

The gateway read on until the upstream closed the body: the client's stream ended only when the body did (here
after the upstream's 5 s hold; the read timeout, 120 s by default, for one that never closes it), and what came
after the last event was relayed. The last event now ends the answer: its content is relayed, nothing after it
is read, and the client's stream ends at once.

Over real sockets: the gateway served by uvicorn, one aiohttp loopback upstream replaying the recorded streams
(tests/fixtures, SOURCES.md), then one event more, then holding the body open.
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
    started = time.monotonic()
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as client:
        resp = client.post(case.path, json=body)
    assert time.monotonic() - started < 3  # not the upstream's hold (HOLD_S), nor the read timeout
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    assert "AFTER" not in resp.text and "error" not in resp.text
    chunks = [json.loads(d) for d in data[:-1]]
    choices = [c for chunk in chunks for c in chunk["choices"]]
    said = "".join(c.get("text") or (c.get("delta") or {}).get("content") or "" for c in choices)
    assert said == case.text
    assert [c["finish_reason"] for c in choices if c.get("finish_reason")] == [case.finish]
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage is not None
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == case.usage
