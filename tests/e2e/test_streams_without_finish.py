"""A stream that ends before every choice it was asked for finished is a stream that ended early, whatever came
before its end: a usage chunk, `data: [DONE]`, or the end of the body.

The gateway under uvicorn, the upstream a loopback server replaying real recordings (tests/fixtures): OpenAI's
davinci-002 completion stream and Fireworks' chat stream (whose finish reason comes only on its last chunk,
with no text, beside the usage), cut before their finish; and the native streams of llama.cpp, TGI and Ollama
cut before their final event. What each cut keeps and adds is built from the recording it cuts, in the shape
the provider documents, and marked where it is built.

The client that saw the stream start gets the error event and `[DONE]`; the break is logged and counted once,
with its cause; with `resume_streams` the stream goes on on another target instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Final

import httpx
import pytest
from aiohttp import web

from tests.e2e.test_observability import metric
from tests.helpers.accesslog import Lines
from tests.helpers.clients import sse_data
from tests.helpers.recordings import fixture_bytes, sse_events
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream, reply_sse, reply_stream

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
retries: {{attempts: 2, same_target: 0, initial_backoff_ms: 0, max_backoff_ms: 0}}
cooldown: {{min_requests: 100}}  # each test's breaks on `cut` are the point, not a reason to skip it
providers:
  cut: {{kind: vllm, base_url: "{u}/cut/v1", discover: false, models: [m]}}
  whole: {{kind: vllm, base_url: "{u}/whole/v1", discover: false, models: [m]}}
  llama: {{kind: llamacpp, base_url: "{u}/llama", max_n: 4}}
  tgi: {{kind: tgi, base_url: "{u}/tgi"}}
  ollama: {{kind: ollama, base_url: "{u}/ollama"}}
models:
  - name: resumed
    strategy: ordered
    resume_streams: true
    targets: [{{model: cut/m}}, {{model: whole/m}}]
"""

_DATA: Final = b"data: "
# The recorded davinci-002 stream: 16 chunks of choice 0, the last with finish_reason "length", then [DONE].
COMPLETION: Final = [
    json.loads(e[len(_DATA) :]) for e in sse_events(fixture_bytes("openai/completion_stream_davinci002.sse.txt"))[:-1]
]
# The recorded Fireworks chat stream: a role chunk, content chunks (`usage: null`), then a chunk with an empty
# delta, finish_reason "length" and the usage, then [DONE].
CHAT: Final = [
    json.loads(e[len(_DATA) :]) for e in sse_events(fixture_bytes("fireworks/chat_stream_via_hf_router.sse.txt"))[:-1]
]
assert COMPLETION[-1]["choices"][0]["finish_reason"] == "length" and len(COMPLETION) == 16
assert CHAT[-1]["choices"][0]["finish_reason"] == "length" and CHAT[-1]["usage"] is not None
KEPT: Final = 5  # the recorded chunks a cut stream sends before its end


def _event(chunk: dict[str, Any]) -> bytes:
    return _DATA + json.dumps(chunk, separators=(",", ":")).encode()


def _usage_chunk(like: dict[str, Any], usage: dict[str, int]) -> dict[str, Any]:
    """The `stream_options.include_usage` chunk (OpenAI's shape: `choices: []` and the usage), with the recorded
    stream's own id, created and model."""
    return {**{k: like[k] for k in ("id", "object", "created", "model")}, "choices": [], "usage": usage}


def _two_choices(chunks: list[dict[str, Any]], finish_second: bool) -> list[dict[str, Any]]:
    """The recorded completion stream as `n: 2` streams it: each recorded chunk for choice 0, then the same
    chunk for choice 1, whose last has no finish reason unless `finish_second`."""
    out: list[dict[str, Any]] = []
    for i, c in enumerate(chunks):
        second = json.loads(json.dumps(c))
        second["choices"][0]["index"] = 1
        if i == len(chunks) - 1 and not finish_second:
            second["choices"][0]["finish_reason"] = None
        out += [c, second]
    return out


def _cut_stream(chat: bool, body: dict[str, Any], end: str) -> list[bytes]:
    """What `cut` streams: the recording's first chunks (both choices' with `n: 2`, the second never finished),
    the usage chunk, then `[DONE]` or (with `end` "eof") nothing: the body just ends."""
    if chat:
        chunks = CHAT[:KEPT]
        usage = CHAT[-1]["usage"]
    elif body.get("n", 1) == 2:
        chunks = _two_choices(COMPLETION, finish_second=False)
        usage = {"prompt_tokens": 5, "completion_tokens": 32, "total_tokens": 37}
    else:
        chunks = COMPLETION[:KEPT]
        usage = {"prompt_tokens": 5, "completion_tokens": KEPT, "total_tokens": 5 + KEPT}
    events = [_event(c) for c in chunks] + [_event(_usage_chunk(chunks[0], usage))]
    return events + ([b"data: [DONE]"] if end == "done" else [])


def _whole_stream(chat: bool, body: dict[str, Any]) -> list[bytes]:
    """What `whole` streams: the recording (a completion's with its usage chunk, as OpenAI sends it asked for
    usage); asked to continue a completion (`max_tokens` below 16), its tail."""
    if chat:
        return [_event(c) for c in CHAT] + [b"data: [DONE]"]
    if body.get("n", 1) == 2:
        chunks = _two_choices(COMPLETION, finish_second=True)
    else:
        chunks = COMPLETION[len(COMPLETION) - int(body.get("max_tokens", 16)) :]
    usage = {"prompt_tokens": 5, "completion_tokens": len(chunks), "total_tokens": 5 + len(chunks)}
    return [_event(c) for c in chunks] + [_event(_usage_chunk(chunks[0], usage)), b"data: [DONE]"]


class Script:
    """How the upstream ends the OpenAI-wire streams of `cut`, and the native streams each test sets."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.end = "done"
        self.native: list[bytes] = []
        self.native_type = "text/event-stream"

    async def __call__(self, request: web.Request, rec: Received) -> web.StreamResponse:
        target = rec.path.split("/")[1]
        if target in ("cut", "whole"):
            body = rec.json()
            chat = rec.path.endswith("/chat/completions")
            events = _cut_stream(chat, body, self.end) if target == "cut" else _whole_stream(chat, body)
            return await reply_sse(events)(request, rec)
        return await reply_stream(self.native, self.native_type)(request, rec)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayThread, Upstream, Script]]:
    script = Script()
    with Upstream() as up:
        up.handler = script
        with serve_config(tmp_path_factory.mktemp("unfinished-streams"), CONFIG.format(u=up.url)) as gw:
            yield gw, up, script


@pytest.fixture
def gw(served: tuple[GatewayThread, Upstream, Script]) -> GatewayThread:
    served[1].received.clear()
    served[2].reset()
    served[0].pipeline.health.reset()
    return served[0]


def _post(gw: GatewayThread, route: str, **body: Any) -> httpx.Response:
    if route == "chat":
        body = {"messages": [{"role": "user", "content": "What is deep learning?"}], "max_tokens": 20, **body}
    else:
        body = {"prompt": "Say this is a test", "max_tokens": 16, **body}
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=15) as c:
        return c.post("/v1/chat/completions" if route == "chat" else "/v1/completions", json={**body, "stream": True})


def _metrics(gw: GatewayThread) -> str:
    with httpx.Client(base_url=gw.url, trust_env=False, timeout=15) as c:
        return c.get("/metrics").text


def _ended_early(resp: httpx.Response) -> list[dict[str, Any]]:
    """The chunks the client got before the error event that ends its stream (asserted), then `[DONE]`."""
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]", data
    error = json.loads(data[-2])["error"]
    assert (error["code"], error["type"]) == ("upstream_stream_ended_early", "upstream_error"), error
    return [json.loads(d) for d in data[:-2]]


@pytest.mark.parametrize("end", ["done", "eof"])
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_a_stream_that_ends_after_its_usage_without_a_finish_reason_ended_early(
    gw: GatewayThread, served: tuple[GatewayThread, Upstream, Script], access: Lines, route: str, end: str
) -> None:
    served[2].end = end
    failures = metric(_metrics(gw), "gateway_upstream_failures_total", target="cut/m", cause="stream_ended_early")
    resp = _post(gw, route, model="cut/m", stream_options={"include_usage": True})
    chunks = _ended_early(resp)
    # What the upstream sent before its end reached the client as it came; no usage chunk, no finish reason.
    assert len(chunks) == KEPT and all(c["choices"] for c in chunks), chunks
    assert all(ch["finish_reason"] is None for c in chunks for ch in c["choices"])
    [line] = [x for x in access.lines if x["request_id"] == resp.headers["x-request-id"]]
    assert (line["status"], line["error"], line["cause"], line["target"]) == (
        502,
        "upstream_stream_ended_early",
        "stream_ended_early",
        "cut/m",
    )
    after = metric(_metrics(gw), "gateway_upstream_failures_total", target="cut/m", cause="stream_ended_early")
    assert after - failures == 1  # counted once, though the stream also had its usage and its end
    assert [r.path.split("/")[1] for r in served[1].received] == ["cut"]  # not retried after the first byte


def test_each_of_n_choices_must_finish(
    gw: GatewayThread, served: tuple[GatewayThread, Upstream, Script], access: Lines
) -> None:
    # Choice 0 finishes, choice 1 streams all its text but never its finish reason; the usage comes, then [DONE].
    resp = _post(gw, "completions", model="cut/m", n=2)
    chunks = _ended_early(resp)
    finished = [ch["index"] for c in chunks for ch in c["choices"] if ch["finish_reason"] is not None]
    assert finished == [0] and {ch["index"] for c in chunks for ch in c["choices"]} == {0, 1}
    [line] = [x for x in access.lines if x["request_id"] == resp.headers["x-request-id"]]
    assert (line["error"], line["cause"]) == ("upstream_stream_ended_early", "stream_ended_early")


@pytest.mark.parametrize(("route", "n"), [("chat", 1), ("completions", 1), ("completions", 2)])
def test_a_finish_reason_on_a_last_chunk_without_text_ends_every_choice(
    gw: GatewayThread, served: tuple[GatewayThread, Upstream, Script], route: str, n: int
) -> None:
    # The recorded streams as they came (Fireworks' finish reason arrives alone, with no text, beside the usage):
    # whole answers, not refused. The recorded chat stream has one choice.
    resp = _post(gw, route, model="whole/m", n=n, stream_options={"include_usage": True})
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]" and all("error" not in json.loads(d) for d in data[:-1]), data
    chunks = [json.loads(d) for d in data[:-1]]
    finishes = {ch["index"]: ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]}
    assert finishes == dict.fromkeys(range(n), "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_a_completion_stream_that_ends_early_after_its_usage_is_resumed(
    gw: GatewayThread, served: tuple[GatewayThread, Upstream, Script], access: Lines
) -> None:
    resp = _post(gw, "completions", model="resumed", stream_options={"include_usage": True})
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all("error" not in c for c in chunks), chunks
    # One uninterrupted stream: the cut's chunks, then the continuation's, the recording's text whole.
    text = "".join(ch["text"] for c in chunks for ch in c["choices"])
    assert text == "".join(c["choices"][0]["text"] for c in COMPLETION)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"] is not None
    cut, whole = served[1].received
    assert (cut.path, whole.path) == ("/cut/v1/completions", "/whole/v1/completions")
    assert whole.json()["max_tokens"] == 16 - KEPT
    [line] = [x for x in access.lines if x["request_id"] == resp.headers["x-request-id"]]
    assert (line["status"], line["cause"], line["target"]) == (200, None, "whole/m")


def test_a_chat_stream_that_ends_early_after_its_usage_is_resumed(
    gw: GatewayThread, served: tuple[GatewayThread, Upstream, Script]
) -> None:
    resp = _post(gw, "chat", model="resumed")
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all("error" not in c for c in chunks), chunks
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    cut, whole = served[1].received
    assert whole.path == "/whole/v1/chat/completions"
    # The continuation carries back what the client was sent, as the assistant message it goes on with.
    sent = "".join(c["choices"][0]["delta"].get("content") or "" for c in CHAT[:KEPT])
    assert whole.json()["messages"][-1] == {"role": "assistant", "content": sent}
    assert whole.json()["continue_final_message"] is True


# -- the native streams, cut before their final event ---------------------------------------------------------

# llama.cpp /completion (tools/server/README.md; no public recording exists, fixtures INDEX): events of
# `content` and `stop: false`, each completion's last with `stop: true`, its stop_type and counts; with `n_cmpl`
# each names its completion's `index`. Completion 0 ends; completion 1 streams text and never its `stop` event.
LLAMA_CUT: Final = [
    {"index": 0, "content": " 1", "stop": False},
    {"index": 1, "content": " A", "stop": False},
    {"index": 0, "content": "", "stop": True, "stop_type": "limit", "tokens_evaluated": 14, "tokens_predicted": 2},
    {"index": 1, "content": " B", "stop": False},
]
# TGI /generate_stream: the recorded final event, and the same token as an intermediate event (TGI's
# StreamResponse: `generated_text` and `details` null until the last).
_TGI_FINAL: Final = json.loads(sse_events(fixture_bytes("tgi/generate_stream_details.sse.txt"))[0][len(b"data:") :])
TGI_CUT: Final = [{**_TGI_FINAL, "index": 0, "generated_text": None, "details": None}]
# Ollama /api/generate: the recorded NDJSON lines before its last (`done: true`, with the counts).
OLLAMA_LINES: Final = fixture_bytes("ollama/generate_stream.ndjson").splitlines()
assert json.loads(OLLAMA_LINES[-1])["done"] is True


@pytest.mark.parametrize("kind", ["llamacpp", "tgi", "ollama"])
def test_a_native_stream_cut_before_its_final_event_ended_early(
    gw: GatewayThread, served: tuple[GatewayThread, Upstream, Script], access: Lines, kind: str
) -> None:
    script = served[2]
    body: dict[str, Any] = {}
    if kind == "llamacpp":
        script.native = [_event(e) + b"\n\n" for e in LLAMA_CUT]
        body = {"model": "llama/m", "n": 2}  # in one call: `max_n` turns llama-server's `n_cmpl` on
    elif kind == "tgi":
        script.native = [b"data:" + json.dumps(e).encode() + b"\n\n" for e in TGI_CUT]
        body = {"model": "tgi/m"}
    else:
        script.native = [line + b"\n" for line in OLLAMA_LINES[:-1]]
        script.native_type = "application/x-ndjson"
        body = {"model": "ollama/llama3"}
    resp = _post(gw, "completions", **body)
    chunks = _ended_early(resp)
    assert chunks and all(ch["finish_reason"] is None or ch["index"] == 0 for c in chunks for ch in c["choices"])
    [line] = [x for x in access.lines if x["request_id"] == resp.headers["x-request-id"]]
    assert (line["status"], line["error"], line["cause"]) == (502, "upstream_stream_ended_early", "stream_ended_early")
    [sent] = served[1].received
    if kind == "llamacpp":
        assert sent.json()["n_cmpl"] == 2
