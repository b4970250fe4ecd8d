"""Budgets hold under concurrency when answers cost more than a guess would say: over real sockets.

A loopback upstream (an OpenAI-compatible server, as vLLM or llama.cpp) reports twice the prompt tokens
the 4-bytes-per-token estimate gives, and, with no `max_tokens`, generates 300 tokens where the API's
default would be 16 (llama.cpp generates until the context ends). 50 requests sent together against a
small budget overspend it by at most one request's reservation, with and without a ledger: the upstream
holds its answers until each of the 50 was admitted or refused, so no settle lands before an admission
however slowly a loaded machine sends them. A stream that runs past its reservation is charged as it
runs: the next request is refused before it ends. A chat's tool definitions and a completion's suffix,
billed as prompt, are counted in its reservation and in the estimate a stream without usage is booked at.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
from aiohttp import web

from tests.helpers.clients import client
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_for, wait_until

KEY: Final = "gk-overshoot-5d1e"
ADMIN: Final = "adm-overshoot-77a0"
ENV: Final = {"OVERSHOOT_KEY": KEY, "OVERSHOOT_ADMIN": ADMIN}
PICO_PER_TOKEN: Final = 10**8  # $100 per 1M tokens, prompt and completion alike
PROMPT: Final = "word " * 80  # 400 bytes: 100 tokens by the 4-bytes estimate, 200 by the upstream's count
UNBOUNDED_TOKENS: Final = 300  # what the upstream generates when the request sets no max_tokens
GATE_S: Final = 20.0  # the longest the upstream holds a burst's answers; a longer wait fails the burst


class Gate:
    """Decided requests of the current burst: each admitted one reaches the upstream, each refused one's
    answer reaches the client. The upstream answers once all are, so the burst's admissions all see only
    reservations, never a settle (a fixed sleep only guesses at that, and a loaded machine outlasts it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.expected = self.decided = 0
        self.all_decided = threading.Event()
        self.all_decided.set()

    def expect(self, n: int) -> None:
        with self.lock:
            self.expected, self.decided = n, 0
            self.all_decided.clear()

    def decide(self) -> None:
        with self.lock:
            self.decided += 1
            if self.decided >= self.expected:
                self.all_decided.set()


GATE: Final = Gate()

CONFIG: Final = """
{redis}
admin: {{key: "${{OVERSHOOT_ADMIN}}"}}
logging: {{requests: false}}
retries: {{attempts: 1}}
{ledger}
keys:
  - {{name: capped, key: "${{OVERSHOOT_KEY}}", max_cost_per_day: {budget}}}
prices:
  "llm/*": {{prompt_per_1m: 100, completion_per_1m: 100}}
caps: {{budget_max_tokens: {cap}}}
providers:
  llm: {{kind: vllm, base_url: "{url}/v1", models: [m]}}
"""


def _completion(got: dict[str, Any], completion: int) -> dict[str, Any]:
    # Twice the gateway's old estimate, of the prompt and the suffix billed with it.
    prompt = (len(got["prompt"].encode()) + len((got.get("suffix") or "").encode())) // 2
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": " x" * min(completion, 50), "finish_reason": "length", "logprobs": None}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def _chat_completion(received: Received) -> dict[str, Any]:
    """A chat answer billing the whole body it was sent as prompt (4 bytes a token), as a provider bills the
    tool definitions with the messages."""
    prompt = len(received.body) // 4
    message = {"role": "assistant", "content": "ok"}
    choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
    usage = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
    return {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [choice], "usage": usage}


async def _longer_than_estimated(request: web.Request, received: Received) -> web.StreamResponse:
    got = received.json()
    GATE.decide()
    if not await wait_for(GATE.all_decided, GATE_S):
        return web.json_response({"error": "the burst was not decided in time"}, status=500)
    if received.path.endswith("/chat/completions"):
        if got.get("stream"):
            return await _chat_stream_without_usage(request)
        return web.json_response(_chat_completion(received))
    if got.get("stream"):
        return await _stream(request, got)
    completion = got["max_tokens"] if got.get("max_tokens") is not None else UNBOUNDED_TOKENS
    return web.json_response(_completion(got, completion))


async def _chat_stream_without_usage(request: web.Request) -> web.StreamResponse:
    """Three words and a finish, and no usage (as llama-cpp-python streams): the gateway books its estimate."""
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for delta, finish in [({"role": "assistant", "content": "a"}, None), ({"content": " b"}, None),
                          ({"content": " c"}, None), ({}, "stop")]:  # fmt: skip
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _completion_stream_without_usage(request: web.Request, received: Received) -> web.StreamResponse:
    """Three words and a finish, and no usage, on the completion route."""
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for text, finish in [("a", None), (" b", None), (" c", None), ("", "stop")]:
        chunk = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
        chunk["choices"] = [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _stream(request: web.Request, got: dict[str, Any]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(UNBOUNDED_TOKENS):
        chunk = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
        chunk["choices"] = [{"index": 0, "text": " x", "finish_reason": None, "logprobs": None}]
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await asyncio.sleep(0.01)
    last = _completion(got, UNBOUNDED_TOKENS)
    last["choices"][0]["text"] = ""
    await resp.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
    return resp


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    GATE.expect(0)
    with Upstream() as up:
        up.handler = _longer_than_estimated
        yield up


def _write(tmp_path: Path, upstream: Upstream, budget: float, ledger: bool, cap: int = 4096, redis: str = "") -> Path:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "config.yaml"
    block = f'ledger: {{url: "{url}", flush_ms: 100}}' if ledger else ""
    shared = f'redis: {{url: "{redis}"}}' if redis else ""
    path.write_text(CONFIG.format(redis=shared, ledger=block, budget=budget, cap=cap, url=upstream.url))
    return path


async def _together(url: str, n: int, body: dict[str, Any], route: str = "/v1/completions") -> list[int]:
    """Send `n` requests at once; the upstream answers the admitted ones once all `n` are decided."""
    GATE.expect(n)

    async def one(c: httpx.AsyncClient) -> int:
        answer = await c.post(f"{url}{route}", json=body)
        if answer.status_code != 200:
            GATE.decide()  # refused before the upstream (an admitted one is decided as it reaches it)
        return answer.status_code

    async with httpx.AsyncClient(trust_env=False, timeout=30, headers={"authorization": f"Bearer {KEY}"}) as c:
        return list(await asyncio.gather(*(one(c) for _ in range(n))))


def _spent(gw: GatewayThread) -> int:
    """Today's spend of the key, in picodollars, as `/admin/usage` reports it."""
    with client(gw.url, ADMIN) as c:
        usage = c.get("/admin/usage")
    assert usage.status_code == 200, usage.text
    cost: float = usage.json()["keys"]["capped"]["cost"]
    return round(cost * 10**12)


def _reservation(max_tokens: int) -> int:
    """One request's worst case as docs/ledger.md#budgets says it: every prompt byte a token, 16 more, and
    its max_tokens (or caps.budget_max_tokens), at the price."""
    return (len(PROMPT.encode()) + 16 + max_tokens) * PICO_PER_TOKEN


@pytest.mark.parametrize("state", ["memory", "redis"])
@pytest.mark.parametrize("ledger", [False, True], ids=["without-ledger", "with-ledger"])
@pytest.mark.parametrize("max_tokens", [50, None], ids=["max_tokens", "no-max_tokens"])
def test_50_requests_longer_than_estimated_overspend_by_at_most_one_reservation(
    tmp_path: Path, upstream: Upstream, ledger: bool, max_tokens: int | None, state: str, request: pytest.FixtureRequest
) -> None:
    budget_pico = 5 * 10**11  # $0.50
    # The Redis the budgets live in answers, however loaded the machine: past the 0.25 s default a stalled
    # event loop reads a reply as a timeout, and the gateway would go on in process memory mid-test.
    redis = request.getfixturevalue("rds").url + "?socket_timeout=5" if state == "redis" else ""
    path = _write(tmp_path, upstream, budget_pico / 10**12, ledger, redis=redis)
    body: dict[str, Any] = {"model": "llm/m", "prompt": PROMPT}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    cost = (len(PROMPT.encode()) // 2 + (max_tokens or UNBOUNDED_TOKENS)) * PICO_PER_TOKEN
    worst = _reservation(max_tokens or 4096)
    with GatewayThread(path, ENV) as gw:
        statuses = asyncio.run(_together(gw.url, 50, body))
        served = statuses.count(200)
        assert served + statuses.count(429) == 50
        # Admitted while the reservations before it were under the budget: no more than that many.
        assert 1 <= served <= budget_pico // worst + 1
        wait_until(lambda: _spent(gw) == served * cost, timeout=10)
        # Then one at a time until the budget refuses: the spend stops within one reservation of it.
        for _ in range(50):
            status = asyncio.run(_together(gw.url, 1, body))[0]
            if status == 429:
                break
            assert status == 200
            served += 1
            wait_until(lambda n=served: _spent(gw) == n * cost, timeout=10)
        assert status == 429
        assert budget_pico <= served * cost <= budget_pico + worst


@pytest.mark.parametrize("state", ["memory", "redis"])
def test_chats_whose_tools_cost_past_the_budget_overspend_it_by_at_most_one_reservation(
    tmp_path: Path, upstream: Upstream, state: str, request: pytest.FixtureRequest
) -> None:
    """Tool definitions are billed as prompt: a chat's worst case counts their JSON's bytes as the prompt's, so
    of 5 chats sent together, each of them worth more than the $0.05 budget, one is served."""
    redis = request.getfixturevalue("rds").url + "?socket_timeout=5" if state == "redis" else ""
    budget_pico = 5 * 10**10  # $0.05
    path = _write(tmp_path, upstream, budget_pico / 10**12, ledger=False, redis=redis)
    tools = [{"type": "function", "function": {"name": "f", "description": PROMPT * 10, "parameters": {}}}]
    body = {"model": "llm/m", "messages": [{"role": "user", "content": "hi"}], "tools": tools, "max_tokens": 10}
    sent = len(json.dumps(tools, separators=(",", ":")).encode())  # 4,000 bytes of description and its JSON
    worst = (len(b"user: hi\n") + 16 + sent + 10) * PICO_PER_TOKEN  # $0.40 or so: past the budget alone
    with GatewayThread(path, ENV) as gw:
        statuses = asyncio.run(_together(gw.url, 5, body, "/v1/chat/completions"))
        assert sorted(statuses) == [200, 429, 429, 429, 429]
        wait_until(lambda: _spent(gw) > 0, timeout=10)
        # The one served was billed about 1,000 prompt tokens ($0.10): past the budget, within one worst case.
        assert budget_pico <= _spent(gw) <= budget_pico + worst


def test_a_chat_stream_without_usage_is_booked_its_tools_with_its_messages(tmp_path: Path, upstream: Upstream) -> None:
    """The estimate a stream without usage is booked at (no token limit counted it first) is the prompt's as
    the budget's reservation reads it: the rendered messages and the tools' JSON, a token per 4 bytes."""
    path = _write(tmp_path, upstream, 1.0, ledger=False)
    tools = [{"type": "function", "function": {"name": "f", "description": PROMPT * 10, "parameters": {}}}]
    body = {"model": "llm/m", "messages": [{"role": "user", "content": "hi"}], "tools": tools, "stream": True}
    prompt = math.ceil(len(b"user: hi\n") / 4) + math.ceil(len(json.dumps(tools, separators=(",", ":"))) / 4)
    with GatewayThread(path, ENV) as gw, client(gw.url, KEY) as c:
        GATE.expect(1)
        resp = c.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
        # The prompt's estimate, and a token for each of the 4 events sent (three words and the finish).
        wait_until(lambda: _spent(gw) == (prompt + 4) * PICO_PER_TOKEN, timeout=10)


@pytest.mark.parametrize("state", ["memory", "redis"])
def test_completions_whose_suffix_costs_past_the_budget_overspend_it_by_at_most_one_reservation(
    tmp_path: Path, upstream: Upstream, state: str, request: pytest.FixtureRequest
) -> None:
    """A completion's suffix is billed as prompt: its worst case counts the suffix's bytes as the prompt's, so of
    5 completions sent together, each of them worth more than the $0.05 budget, one is served."""
    redis = request.getfixturevalue("rds").url + "?socket_timeout=5" if state == "redis" else ""
    budget_pico = 5 * 10**10  # $0.05
    path = _write(tmp_path, upstream, budget_pico / 10**12, ledger=False, redis=redis)
    suffix = PROMPT * 10  # 4,000 bytes
    body = {"model": "llm/m", "prompt": "hi", "suffix": suffix, "max_tokens": 10}
    worst = (len(b"hi") + 16 + len(suffix) + 10) * PICO_PER_TOKEN  # $0.40 or so: past the budget alone
    with GatewayThread(path, ENV) as gw:
        statuses = asyncio.run(_together(gw.url, 5, body))
        assert sorted(statuses) == [200, 429, 429, 429, 429]
        wait_until(lambda: _spent(gw) > 0, timeout=10)
        # The one served was billed about 2,000 prompt tokens ($0.20): past the budget, within one worst case.
        assert budget_pico <= _spent(gw) <= budget_pico + worst


def test_a_completion_stream_without_usage_is_booked_its_suffix_with_its_prompt(
    tmp_path: Path, upstream: Upstream
) -> None:
    """The estimate a completion stream without usage is booked at is its prompt's and its suffix's, a token per
    4 bytes each, as a chat's is its messages' and tools'."""
    path = _write(tmp_path, upstream, 1.0, ledger=False)
    upstream.handler = _completion_stream_without_usage
    suffix = PROMPT * 10
    body = {"model": "llm/m", "prompt": "hi", "suffix": suffix, "stream": True}
    prompt = math.ceil(len(b"hi") / 4) + math.ceil(len(suffix) / 4)
    with GatewayThread(path, ENV) as gw, client(gw.url, KEY) as c:
        resp = c.post("/v1/completions", json=body)
        assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n")
        # The prompt's estimate, and a token for each of the 4 events sent (three words and the finish).
        wait_until(lambda: _spent(gw) == (prompt + 4) * PICO_PER_TOKEN, timeout=10)


@pytest.mark.parametrize("ledger", [False, True], ids=["without-ledger", "with-ledger"])
def test_a_stream_past_its_reservation_stops_the_next_admissions_before_it_ends(
    tmp_path: Path, upstream: Upstream, ledger: bool
) -> None:
    """caps.budget_max_tokens 10: the stream reserves 426 tokens ($0.0426) of a $0.06 budget, and a request sent
    beside it would be admitted on that alone. Charged as it runs (416 prompt tokens at most, then one per
    event), it holds more than the budget from its 184th event on: the request sent at its 250th is refused."""
    path = _write(tmp_path, upstream, 0.06, ledger, cap=10)
    body = {"model": "llm/m", "prompt": PROMPT, "stream": True}
    with GatewayThread(path, ENV) as gw, client(gw.url, KEY, timeout=30) as c:
        with c.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            events = 0
            probe = None
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    events += 1
                if events == 250 and probe is None:
                    probe = asyncio.run(_together(gw.url, 1, {**body, "stream": False}))[0]
            assert events == UNBOUNDED_TOKENS + 1  # and the usage chunk
        assert probe == 429
        # Charged in full once it ended: 200 prompt and 300 completion tokens.
        wait_until(lambda: _spent(gw) == 500 * PICO_PER_TOKEN, timeout=10)
