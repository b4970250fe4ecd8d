"""Everything the gateway is, on `/v1/chat/completions`, over real sockets: rate limits and budgets settled
on the usage a chat answer reports, retries, a fallback from an OpenAI-compatible kind to Anthropic that
answers the same `chat.completion` shape, hedging, a fleet's prefix routing and sessions over the
rendered conversation, the request metrics, access log and traces split by endpoint, and the status page.

The upstreams are the loopback engine of tests/helpers/engine.py (a chat request's usage: the words of its
last message, and `max_tokens` generated), Anthropic's recorded Messages answer, and three replicas that
answer a recorded OpenAI chat completion.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from tests.e2e.test_observability import metric
from tests.e2e.test_tracing import SERVER, Receiver
from tests.helpers.accesslog import Lines
from tests.helpers.clients import openai_client
from tests.helpers.engine import Engine
from tests.helpers.recordings import fixture_bytes
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream, reply, reply_sse
from tests.helpers.waiting import wait_until
from tests.queue.conftest import ask_chat, gate, hold_one, until
from tests.queue.conftest import config as queue_config

ADMIN = "adm-chat-everything-4d2e"
CLAUDE = fixture_bytes("anthropic/messages_end_turn.json")
CHAT = fixture_bytes("openai/chat_completion.json")

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
retries: {{attempts: 2, initial_backoff_ms: 0, max_backoff_ms: 0}}
admin: {{key: "{admin}"}}
keys:
  - {{name: limited, key: k-limited, limits: {{tpm: 1000}}}}
  - {{name: spender, key: k-spender, max_cost_per_day: 0.3}}
  - {{name: plain, key: k-plain}}
prices:
  eng/m: {{prompt_per_1m: 1000, completion_per_1m: 2000}}
providers:
  eng: {{kind: vllm, base_url: "{eng}/v1", discover: false, models: [m]}}
  slow: {{kind: vllm, base_url: "{slow}/v1", discover: false, models: [m]}}
  down: {{kind: vllm, base_url: "{down}/v1", discover: false, models: [m]}}
  claude: {{kind: anthropic, base_url: "{claude}", api_key: sk-ant}}
  demo: {{kind: fake, models: [text]}}
  fleet:
    kind: vllm
    discover: false
    models: [m]
    replicas: [{replicas}]
    routing: {{policy: prefix}}
  sessions:
    kind: vllm
    discover: false
    models: [m]
    replicas: [{replicas}]
    routing: {{policy: session}}
models:
  - name: mixed
    retries: {{attempts: 3}}
    targets: [{{model: down/m}}]
    fallbacks: [claude/claude-3-opus-20240229]
  - name: hedged
    strategy: ordered
    hedge_after_ms: 150
    targets: [{{model: slow/m}}, {{model: eng/m}}]
"""


class Servers:
    def __init__(self) -> None:
        self.eng = Engine()
        self.slow = Engine(hold_s=3.0)
        self.down = Upstream()
        self.claude = Upstream()
        self.replicas = [Upstream() for _ in range(3)]

    def all(self) -> list[Upstream]:
        return [self.eng, self.slow, self.down, self.claude, *self.replicas]


async def _unavailable(request: web.Request, received: Received) -> web.StreamResponse:
    return web.Response(status=503, text='{"error": {"message": "overloaded"}}', content_type="application/json")


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    s = Servers()
    for u in s.all():
        u.start()
    s.down.handler = _unavailable
    s.claude.handler = reply(CLAUDE)
    for r in s.replicas:
        r.handler = reply(CHAT)
    try:
        yield s
    finally:
        for u in s.all():
            u.stop()


@pytest.fixture(scope="module")
def gw(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    text = CONFIG.format(
        admin=ADMIN,
        eng=servers.eng.url,
        slow=servers.slow.url,
        down=servers.down.url,
        claude=servers.claude.url,
        replicas=", ".join(f"{r.url}/v1" for r in servers.replicas),
    )
    with serve_config(tmp_path_factory.mktemp("chat-everything"), text) as gateway:
        yield gateway


def chat(gw: GatewayThread, model: str, text: str, key: str = "k-plain", **extra: Any) -> httpx.Response:
    messages = extra.pop("messages", None) or [{"role": "user", "content": text}]
    headers = {"authorization": f"Bearer {key}", **extra.pop("headers", {})}
    with httpx.Client(base_url=gw.url, timeout=20, trust_env=False) as c:
        return c.post("/v1/chat/completions", json={"model": model, "messages": messages, **extra}, headers=headers)


def admin(gw: GatewayThread, path: str) -> dict[str, Any]:
    with httpx.Client(base_url=gw.url, timeout=10, trust_env=False) as c:
        resp = c.get(path, headers={"authorization": f"Bearer {ADMIN}"})
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def _tpm_remaining(gw: GatewayThread) -> int:
    [bucket] = [b for b in admin(gw, "/admin/status")["limits"] if b["kind"] == "tpm" and "limited" in b["scope"]]
    return int(bucket["remaining"])


def test_a_rate_limit_settles_on_the_usage_a_chat_answer_reports(gw: GatewayThread) -> None:
    full = _tpm_remaining(gw)
    # Admitted on its worst case (its conversation and 600 tokens), settled on the 34 the answer reports.
    resp = chat(gw, "fleet/m", "limited asks this", key="k-limited", max_tokens=600)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["total_tokens"] == 34  # the recording's
    # Settled just after the answer: 34 used, not the ~606 reserved (the bucket refills 1000 a minute meanwhile).
    wait_until(lambda: full - _tpm_remaining(gw) <= 34, timeout=3)
    assert full - _tpm_remaining(gw) >= 28


def test_a_budget_is_charged_at_the_price_of_the_chat_usage(gw: GatewayThread) -> None:
    resp = chat(gw, "eng/m", "spender asks a question", key="k-spender", max_tokens=100)
    assert resp.status_code == 200, resp.text
    # 4 prompt tokens at $1000/1M and 100 generated at $2000/1M.
    want = 4 * 1000 / 1e6 + 100 * 2000 / 1e6

    def booked() -> bool:
        key = admin(gw, "/admin/usage")["keys"].get("spender", {})
        return bool(key.get("requests") == 1 and abs(key.get("cost", 0) - want) < 1e-9)

    wait_until(booked, timeout=5)
    key = admin(gw, "/admin/usage")["keys"]["spender"]
    assert (key["prompt_tokens"], key["completion_tokens"]) == (4, 100)
    # $0.204 of $0.30 spent: one more is admitted, and once it is booked the budget is spent.
    assert chat(gw, "eng/m", "spender asks again", key="k-spender", max_tokens=100).status_code == 200
    wait_until(lambda: admin(gw, "/admin/usage")["keys"]["spender"]["requests"] == 2, timeout=5)
    refused = chat(gw, "eng/m", "spender asks once more", key="k-spender", max_tokens=100)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"


def test_a_chat_retry_then_a_fallback_from_vllm_to_anthropic_answers_chat(gw: GatewayThread, servers: Servers) -> None:
    servers.eng.failures = 1
    retried = chat(gw, "eng/m", "plain retry me", max_tokens=2)
    assert retried.status_code == 200, retried.text
    assert retried.headers["x-gateway-attempts"] == "2"
    before = len(servers.claude.received)
    resp = chat(gw, "mixed", "What is the capital of France?")
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-gateway-provider"] == "claude"
    assert len(servers.claude.received) == before + 1
    answer = resp.json()
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    assert answer["model"] == "mixed"
    assert answer["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "The capital of France is Paris."},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    assert answer["usage"]["prompt_tokens"] == 20 and answer["usage"]["completion_tokens"] == 10
    # The same answer shape as the vLLM target's when it is up.
    direct = chat(gw, "eng/m", "plain direct", max_tokens=2).json()
    assert set(direct) == set(answer) and set(direct["choices"][0]) == set(answer["choices"][0])


def test_a_slow_chat_target_is_hedged(gw: GatewayThread, servers: Servers) -> None:
    start = time.monotonic()
    resp = chat(gw, "hedged", "plain hedge me", max_tokens=2)
    took = time.monotonic() - start
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-gateway-provider"] == "eng" and resp.headers["x-gateway-attempts"] == "2"
    assert took < 2.5  # the slow target holds for 3 s
    assert resp.json()["choices"][0]["message"]["content"] == "xx"


def _home(servers: Servers, before: list[int]) -> int:
    now = [len(r.received) for r in servers.replicas]
    changed = [i for i, (a, b) in enumerate(zip(before, now, strict=True)) if a != b]
    assert len(changed) == 1, (before, now)
    return changed[0]


def test_prefix_routing_returns_each_conversation_to_its_replica(gw: GatewayThread, servers: Servers) -> None:
    system = "You are a careful assistant who answers questions about the history of science. " * 12
    homes: dict[int, set[int]] = {}
    for c in range(9):
        messages: list[dict[str, Any]] = [{"role": "system", "content": f"[conversation {c}] {system}"}]
        for turn in range(3):
            messages.append({"role": "user", "content": f"question {turn} of conversation {c}?"})
            before = [len(r.received) for r in servers.replicas]
            resp = chat(gw, "fleet/m", "", messages=messages)
            assert resp.status_code == 200, resp.text
            home = _home(servers, before)
            assert resp.headers["x-gateway-model"] == f"fleet@{home}/m"
            homes.setdefault(c, set()).add(home)
            messages.append(resp.json()["choices"][0]["message"])
    assert all(len(h) == 1 for h in homes.values()), homes  # every later turn went where the first did
    assert len({next(iter(h)) for h in homes.values()}) > 1  # and the conversations spread


def test_chat_sessions_stick_to_their_replica(gw: GatewayThread, servers: Servers) -> None:
    homes: dict[str, set[int]] = {}
    # Twelve sessions: the ring places the replicas by their (random) ports, and six all landed on one replica
    # in about 1 run in 300; twelve do in about 1 in 180,000.
    for turn in range(3):
        for s in range(12):
            before = [len(r.received) for r in servers.replicas]
            if s % 2:
                resp = chat(gw, "sessions/m", f"turn {turn}", user=f"u{s}")
            else:
                resp = chat(gw, "sessions/m", f"turn {turn}", headers={"x-session-id": f"s{s}"})
            assert resp.status_code == 200, resp.text
            homes.setdefault(str(s), set()).add(_home(servers, before))
    assert all(len(h) == 1 for h in homes.values()), homes
    assert len({next(iter(h)) for h in homes.values()}) > 1, homes


def test_metrics_and_the_access_log_split_chat_from_completions(gw: GatewayThread, access: Lines) -> None:
    with httpx.Client(base_url=gw.url, timeout=10, trust_env=False) as c:
        auth = {"authorization": "Bearer k-plain"}
        assert c.post("/v1/completions", json={"model": "demo/text", "prompt": "a"}, headers=auth).status_code == 200
        resp = chat(gw, "demo/text", "metrics")
        assert resp.status_code == 200
        text = c.get("/metrics").text
    chat_id = resp.headers["x-request-id"]
    assert metric(text, "gateway_requests_total", endpoint="chat", model="demo/text", status="200") == 1
    assert metric(text, "gateway_requests_total", endpoint="completions", model="demo/text", status="200") == 1
    assert metric(text, "gateway_request_duration_seconds_count", endpoint="chat", provider="demo") == 1
    wait_until(lambda: any(line["request_id"] == chat_id for line in access.lines), timeout=5)
    [line] = [line for line in access.lines if line["request_id"] == chat_id]
    assert line["endpoint"] == "chat" and line["model"] == "demo/text" and line["status"] == 200


def test_the_status_page_shows_chat_traffic(gw: GatewayThread, servers: Servers) -> None:
    def booked() -> int:
        return int(admin(gw, "/admin/status")["usage"]["keys"].get("plain", {}).get("requests", 0))

    wait_until(lambda: booked() == booked(), timeout=5)
    before = booked()
    for _ in range(2):
        assert chat(gw, "mixed", "plain, cooling the down target").status_code == 200
    wait_until(lambda: booked() == before + 2, timeout=5)  # chat requests are booked in today's usage

    def down() -> dict[str, Any]:
        targets: list[dict[str, Any]] = admin(gw, "/admin/status")["targets"]
        [target] = [t for t in targets if t["target"] == "down/m"]
        return target

    # The target the chat requests fell back past is shown failing, then cooling.
    for _ in range(8):
        if down()["state"] == "cooling":
            break
        assert chat(gw, "mixed", "plain, cooling the down target").status_code == 200
    assert down()["state"] == "cooling" and down()["failures"] >= 1


@pytest.fixture
def traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[GatewayThread, Receiver]]:
    receiver = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    try:
        config = "tracing: {enabled: true}\nproviders:\n  demo: {kind: fake, models: [text]}\n"
        with serve_config(tmp_path, config) as g:
            yield g, receiver
    finally:
        receiver.close()


def test_a_chat_request_is_a_chat_span(traced: tuple[GatewayThread, Receiver]) -> None:
    gw, receiver = traced
    with httpx.Client(base_url=gw.url, timeout=10, trust_env=False) as c:
        body = {"model": "demo/text", "messages": [{"role": "user", "content": "span me"}], "max_tokens": 3}
        trace = "4bf92f3577b34da6a3ce929d0e0e4736"
        resp = c.post("/v1/chat/completions", json=body, headers={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"})
    assert resp.status_code == 200, resp.text
    spans = receiver.wait(1, trace)
    [server] = [s for s in spans if s.kind == SERVER]
    assert server.name == "POST /v1/chat/completions"
    assert server.attributes["gen_ai.operation.name"] == "chat"
    assert server.attributes["gen_ai.request.model"] == "demo/text"
    assert server.attributes["gen_ai.usage.output_tokens"] == 3


async def test_a_quiet_tenants_chats_are_served_beside_a_flood(tmp_path: Path) -> None:
    """Fair share on chat: with the one slot of a `max_concurrency: 1` server taken, 12 chat requests of one
    tenant then 3 of another wait in the gateway's queue; the quiet tenant's are not served last."""
    with Engine() as engine, serve_config(tmp_path, queue_config(engine, 1)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            blocker = await hold_one(client, engine, "blocker")
            g = gate(gw)
            tasks = []
            for i, key in enumerate(["noisy"] * 12 + ["quiet"] * 3):
                tasks.append(asyncio.ensure_future(ask_chat(client, key)))
                await until(lambda i=i: g.order.depth == i + 1)
            engine.running.set()
            answers = await asyncio.gather(*tasks)
            assert (await blocker).status_code == 200
    assert [r.status_code for r in answers] == [200] * 15
    assert {r.json()["object"] for r in answers} == {"chat.completion"}
    order = [t for t in engine.order if t != "blocker"]
    assert max(i for i, t in enumerate(order) if t == "quiet") <= 6, order


# -- an answer without a finish reason: the generation did not end ------------------------------------------

UNFINISHED_CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 2, initial_backoff_ms: 0, max_backoff_ms: 0}}
cooldown: {{min_requests: 100}}  # each test's failures on `cut` are the point, not a reason to skip it
providers:
  cut: {{kind: vllm, base_url: "{u}/cut/v1", discover: false, models: [m]}}
  whole: {{kind: vllm, base_url: "{u}/whole/v1", discover: false, models: [m]}}
  mcut: {{kind: mistral, base_url: "{u}/cut", api_key: k}}
models:
  - name: either
    strategy: ordered
    targets: [{{model: cut/m}}, {{model: whole/m}}]
"""


def _unfinished(body: bytes) -> bytes:
    """A recorded answer with its choices' finish reasons taken out, as a proxy that cut the body short or a
    server that stopped mid-generation would leave it."""
    answer = json.loads(body)
    for choice in answer["choices"]:
        choice["finish_reason"] = None
    return json.dumps(answer).encode()


async def _cut_or_whole(request: web.Request, rec: Received) -> web.StreamResponse:
    chat = rec.path.endswith("/chat/completions")
    if rec.json().get("stream"):
        kind = "chat.completion.chunk" if chat else "text_completion"
        choice: dict[str, Any] = {"index": 0, "finish_reason": None}
        choice |= {"delta": {"role": "assistant", "content": "Hi"}} if chat else {"text": "Hi"}
        chunk = {"id": "x", "object": kind, "created": 1, "model": "m", "choices": [choice]}
        return await reply_sse([b"data: " + json.dumps(chunk).encode(), b"data: [DONE]"])(request, rec)
    body = CHAT if chat else fixture_bytes("vllm/completion_opt125m.json")
    return await reply(_unfinished(body) if rec.path.startswith("/cut/") else body)(request, rec)


@pytest.fixture(scope="module")
def unfinished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayThread, Upstream]]:
    with Upstream() as up:
        up.handler = _cut_or_whole
        with serve_config(tmp_path_factory.mktemp("unfinished"), UNFINISHED_CONFIG.format(u=up.url)) as g:
            yield g, up


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_an_answer_without_a_finish_reason_fails_as_a_stream_that_ended_early(
    unfinished: tuple[GatewayThread, Upstream], route: str
) -> None:
    # Every recorded OpenAI-wire answer (tests/fixtures, /work/shared/fixtures) carries one: a choice without
    # it did not end, buffered as streamed, and is neither relayed as `null` nor cached.
    gw, up = unfinished
    with openai_client(gw.url + "/v1", "unused") as client:

        def ask(model: str, stream: bool) -> Any:
            if route == "chat":
                messages: Any = [{"role": "user", "content": "Hi"}]
                return client.chat.completions.create(model=model, messages=messages, stream=stream)
            return client.completions.create(model=model, prompt="Hi", stream=stream)

        with pytest.raises(openai.APIStatusError) as caught:
            ask("cut/m", False)
        body: Any = caught.value.body
        assert caught.value.status_code == 502 and body["code"] == "upstream_stream_ended_early", body
        # The stream started with its text: the same failure ends it as an error event.
        with pytest.raises(openai.APIError) as streamed:
            for _ in ask("cut/m", True):
                pass
        assert "ended the stream early" in streamed.value.message, streamed.value.body
        up.received.clear()
        # Another target gives the whole answer, as after any failed attempt.
        answer = ask("either", False)
        assert answer.choices[0].finish_reason in ("stop", "length")
        assert [r.path.split("/")[1] for r in up.received] == ["cut", "whole"]


def test_mistrals_completion_without_a_finish_reason_fails_the_same_way(
    unfinished: tuple[GatewayThread, Upstream],
) -> None:
    # Mistral's completions are its chat answers read back as text: the same rule on the same shape.
    gw, _ = unfinished
    with openai_client(gw.url + "/v1", "unused") as client, pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model="mcut/mistral-small-latest", prompt="Hi")
    body: Any = caught.value.body
    assert caught.value.status_code == 502 and body["code"] == "upstream_stream_ended_early", body
