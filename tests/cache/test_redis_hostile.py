"""Redis values another process wrote: well formed as this version's entries, but not an answer to the
request whose name they sit under. Each is a miss, counted, never served and never an error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest

from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream
from wire.chat import ChatChoice, ChatCompletion, ChatMessage
from wire.schema import encode

from .conftest import ADMIN, MODEL, client, config
from .test_chat import ChatServer, ask


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def _redis_config(upstream: Upstream, redis_server: RedisServer) -> str:
    return config(upstream, f"redis: {{url: '{redis_server.url}'}}").replace(
        "cache: {mode: deterministic}", "cache: {mode: deterministic, store: redis}"
    )


@pytest.fixture(scope="module")
def gw(vllm: Any, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("hostile"), _redis_config(vllm[1], redis_server)) as gateway:
        yield gateway


def _entry(body: bytes | None, events: list[Any] | None = None, usage: list[int] | None = None) -> bytes:
    head = [2, 1e9, MODEL, "local", MODEL]
    usage_ = dict(zip(("prompt_tokens", "completion_tokens", "total_tokens"), usage, strict=True)) if usage else None
    return b"gwc2:" + msgspec.msgpack.encode([*head, usage_, events or [], None, body])


def _choice(index: int, finish: str | None) -> dict[str, Any]:
    return {"text": "planted", "index": index, "logprobs": None, "finish_reason": finish}


# A chat answer as the gateway stores one (its `chat.completion` client bytes).
_CHAT_BODY = encode(
    ChatCompletion(
        id="x",
        created=1,
        model="m",
        choices=[ChatChoice(0, ChatMessage(role="assistant", content="planted"), "stop", None)],
    )
)
_TEXT_BODY = (
    b'{"object":"text_completion","id":"x","created":1,"model":"m","choices":[{"text":"planted","index":0,'
    b'"logprobs":null,"finish_reason":"stop"}]}'
)
# Valid JSON whose first `,"choices":` is not the answer's own: served from there, it would not be JSON.
_NESTED_BODY = b'{"object":"text_completion","id":{"a":1,"choices":[]},"choices":' + _TEXT_BODY.split(b'"choices":')[1]


def _planted(redis_server: RedisServer, value: bytes) -> None:
    # Every name: a stream's entry is written after its client has read the end, so a test before this one
    # may still add its own after the flush (under another name, which planting leaves as harmless).
    r = redis_server.client()
    names = r.keys("gwcache:*")
    assert names
    for name in names:
        r.set(name, value)


def _not_entries(c: httpx.Client) -> int:
    status = c.get("/admin/status", headers={"authorization": f"Bearer {ADMIN}"}).json()["cache"]
    return int(status["redis_not_entries"])


@pytest.mark.parametrize(
    ("value", "n"),
    [
        pytest.param(_entry(None, []), 1, id="no-events"),
        pytest.param(_entry(None, [[_choice(0, None)]]), 1, id="unfinished-choice"),
        pytest.param(_entry(None, [[_choice(0, "stop")]]), 2, id="fewer-choices-than-n"),
        pytest.param(_entry(None, [[_choice(3, "stop")]]), 1, id="choice-out-of-range"),
        pytest.param(_entry(_CHAT_BODY), 1, id="chat-answer"),
        pytest.param(_entry(_TEXT_BODY), 2, id="answer-fewer-choices-than-n"),
        pytest.param(_entry(_NESTED_BODY), 1, id="nested-choices-field"),
        pytest.param(_entry(_TEXT_BODY[:-1] + b',"usage":"none"}'), 1, id="usage-not-an-object"),
        pytest.param(_entry(_TEXT_BODY, usage=[-5, 1, -4]), 1, id="negative-usage"),
        pytest.param(_entry(_TEXT_BODY, usage=[2**62, 1, 2**62 + 1]), 1, id="usage-past-any-answer"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_planted_entry_that_does_not_answer_the_request_is_a_miss(
    gw: GatewayThread, upstream: Upstream, redis_server: RedisServer, value: bytes, n: int, stream: bool
) -> None:
    redis_server.client().flushall()
    payload = {"model": MODEL, "prompt": f"hostile {value!r} {n} {stream}", "max_tokens": 3, "temperature": 0}
    payload |= {"n": n, "stream": stream}
    with client(gw.url) as c:
        assert c.post("/v1/completions", json=payload).status_code == 200
        _planted(redis_server, value)
        before = _not_entries(c)
        again = c.post("/v1/completions", json=payload)
        assert again.status_code == 200, again.text
        assert again.headers["x-gateway-cache"] == "miss"
        assert b"planted" not in again.content
        if not stream:
            assert len(again.json()["choices"]) == n
        assert _not_entries(c) == before + 1
    assert len(upstream.received) == 2


@pytest.fixture(scope="module")
def chat_gw(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with Upstream() as up:
        up.handler = ChatServer().handler
        with serve_config(tmp_path_factory.mktemp("hostilechat"), _redis_config(up, redis_server)) as gateway:
            yield gateway


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(_entry(None, [[_choice(0, "stop")]]), id="completion-events"),
        pytest.param(_entry(_TEXT_BODY), id="completion-answer"),
        pytest.param(_entry(_CHAT_BODY.replace(b'"created":1', b'"created":"x"')), id="chat-answer-bad-head"),
        pytest.param(_entry(_CHAT_BODY[:-1] + b',"usage":[]}'), id="chat-answer-bad-tail"),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_planted_completion_under_a_chat_name_is_a_miss(
    chat_gw: GatewayThread, redis_server: RedisServer, value: bytes, stream: bool
) -> None:
    redis_server.client().flushall()
    payload = ask(f"hostile chat {value!r} {stream}") | {"stream": stream}
    with client(chat_gw.url) as c:
        assert c.post("/v1/chat/completions", json=payload).status_code == 200
        _planted(redis_server, value)
        before = _not_entries(c)
        again = c.post("/v1/chat/completions", json=payload)
        assert again.status_code == 200, again.text
        assert again.headers["x-gateway-cache"] == "miss"
        assert b"planted" not in again.content
        assert b"error" not in again.content
        assert _not_entries(c) == before + 1


def test_a_write_redis_refuses_leaves_the_redis_in_use(
    gw: GatewayThread, upstream: Upstream, redis_server: RedisServer
) -> None:
    # A full Redis under `maxmemory` with `noeviction` refuses writes (OOM) and still serves reads: a
    # refused write stores nothing, and the entries already there keep serving (and the rest of the Redis,
    # the shared limits, stays in use).
    r = redis_server.client()
    r.flushall()
    stored = {"model": MODEL, "prompt": "hostile: stored before full", "max_tokens": 3, "temperature": 0}
    with client(gw.url) as c:
        assert c.post("/v1/completions", json=stored).headers["x-gateway-cache"] == "miss"
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", "1")
        try:
            refused = c.post("/v1/completions", json=stored | {"prompt": "hostile: after full"})
            assert refused.status_code == 200, refused.text
            assert refused.headers["x-gateway-cache"] == "miss"
            assert c.post("/v1/completions", json=stored).headers["x-gateway-cache"] == "hit"
            status = c.get("/admin/status", headers={"authorization": f"Bearer {ADMIN}"}).json()["cache"]
            assert status["redis_refused_writes"] >= 1
        finally:
            r.config_set("maxmemory", "0")
    assert len(upstream.received) == 2


_BAD_NAMES = ["local\r\nset-cookie: planted=1", "x" * 100_000, "caf\u00e9\x00"]


@pytest.mark.parametrize("name", _BAD_NAMES, ids=["crlf", "long", "nul"])
@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_planted_target_name_never_reaches_a_header_line_as_it_is(
    gw: GatewayThread, upstream: Upstream, redis_server: RedisServer, name: str, stream: bool
) -> None:
    redis_server.client().flushall()
    payload = {"model": MODEL, "prompt": f"hostile name {name[:8]!r} {stream}", "max_tokens": 3, "temperature": 0}
    payload["stream"] = stream
    with client(gw.url) as c:
        assert c.post("/v1/completions", json=payload).status_code == 200
        value = b"gwc2:" + msgspec.msgpack.encode([2, 1e9, MODEL, name, name, None, [], None, _TEXT_BODY])
        _planted(redis_server, value)
        again = c.post("/v1/completions", json=payload)
        assert again.status_code == 200, again.text
        assert "set-cookie" not in again.headers
        assert len(again.headers.get("x-gateway-model", "")) < 10_000


@pytest.mark.parametrize("prompts", [1, 2], ids=["one-prompt", "batch"])
def test_a_planted_value_past_max_entry_bytes_is_not_read_whole(
    gw: GatewayThread, upstream: Upstream, redis_server: RedisServer, prompts: int
) -> None:
    # A value is never larger than `max_entry_bytes` (4 MiB by default) when the gateway wrote it: one larger
    # is read no further than that, so a planted 64 MiB value costs no 64 MiB per request reading it.
    r = redis_server.client()
    r.flushall()
    text = [f"hostile: huge {prompts} {i}" for i in range(prompts)]
    payload = {"model": MODEL, "prompt": text if prompts > 1 else text[0], "max_tokens": 3, "temperature": 0}
    with client(gw.url) as c:
        assert c.post("/v1/completions", json=payload).status_code == 200
        names = r.keys("gwcache:*")
        assert len(names) >= prompts
        for name in names:
            r.set(name, b"gwc2:" + b"x" * (64 << 20))
        sent = int(r.info("stats")["total_net_output_bytes"])
        again = c.post("/v1/completions", json=payload)
        assert again.status_code == 200, again.text
        assert again.headers["x-gateway-cache"] == "miss"
        read = int(r.info("stats")["total_net_output_bytes"]) - sent
    assert read < prompts * (4 << 20) + (1 << 20), read
