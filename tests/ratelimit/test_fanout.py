"""An emulated fan-out (`n`, `best_of`, prompt lists) charges the provider's and deployment's request buckets
once per upstream call it makes, over real sockets: the gateway under uvicorn, a loopback TGI upstream
(one prompt and one choice per call; llama.cpp for guided retries) counting what it receives, and a real
redis-server.

Limits are per minute, so nothing refills while a test runs and every count is exact.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.helpers.clients import client
from tests.helpers.recordings import fixture_bytes, sse_events
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream, reply, reply_sse
from tests.helpers.waiting import wait_until

CONFIG = """
redis: {{url: "{redis}", on_failure: fail_closed}}
retries: {{attempts: 3}}
keys:
  - {{name: team-a, key: k-a}}
  - {{name: team-b, key: k-b}}
providers:
  hf: {{kind: tgi, base_url: "{upstream}", limits: {{rpm: 10}}}}
  dep:
    kind: tgi
    base_url: "{upstream}"
    deployments: {{east: {{limits: {{rpm: 4}}}}}}
  llama: {{kind: llamacpp, base_url: "{upstream}", limits: {{rpm: 2}}}}
models:
  - {{name: pair, strategy: ordered, targets: [{{model: hf/m}}, {{model: dep/m}}]}}
"""

ANSWER = reply(fixture_bytes("tgi/generate_details_length.json"))
STREAM = reply_sse(sse_events(fixture_bytes("tgi/generate_stream_details.sse.txt")))


# llama.cpp's `/completion` answer (the fields its server README documents): never one of the choices asked.
LLAMA = reply(
    json.dumps(
        {"content": "maybe", "stop": True, "stop_type": "eos", "tokens_evaluated": 1, "tokens_predicted": 1}
    ).encode()
)


# TGI's Messages API answer (its OpenAI chat shape): one choice per call.
CHAT = reply(
    json.dumps(
        {
            "object": "chat.completion",
            "id": "",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "yes"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    ).encode()
)


async def _upstream(request: web.Request, received: Received) -> web.StreamResponse:
    if received.path == "/v1/chat/completions":
        return await CHAT(request, received)
    if received.path == "/completion":
        return await LLAMA(request, received)
    return await (STREAM if received.path.endswith("_stream") else ANSWER)(request, received)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def gw(
    redis_server: RedisServer, upstream: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayThread]:
    cfg = CONFIG.format(redis=redis_server.url, upstream=upstream.url)
    with serve_config(tmp_path_factory.mktemp("rl-fanout"), cfg) as g:
        yield g


@pytest.fixture
def g(gw: GatewayThread, rds: RedisServer, upstream: Upstream) -> GatewayThread:
    """The module's gateway over an empty Redis, its upstream counting from zero."""
    upstream.reset()
    upstream.handler = _upstream
    return gw


def post(gw: GatewayThread, key: str, payload: dict[str, Any]) -> httpx.Response:
    with client(gw.url, key) as c:
        return c.post("/v1/completions", json=payload)


def units(rds: RedisServer, key: str) -> float:
    """Units charged to a rate bucket since it was last empty (the script stores `ms:units`)."""
    with rds.client() as r:
        raw = r.get(key)
    assert raw is not None, key
    return float(raw.split(":")[1])


def test_fan_out_charges_each_call_and_one_tenant_cannot_overrun_the_provider(
    g: GatewayThread, rds: RedisServer, upstream: Upstream
) -> None:
    fan = {"model": "hf/m", "prompt": "test", "max_tokens": 1, "n": 4}
    assert post(g, "k-a", fan).status_code == 200
    assert len(upstream.received) == 4
    assert units(rds, "rl:{provider:hf}:rpm") == 4
    assert post(g, "k-a", fan).status_code == 200
    assert len(upstream.received) == 8
    # Two calls are left of rpm 10: a fan-out of four is refused whole, before any of its calls.
    refused = post(g, "k-a", fan)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "provider_quota"
    assert int(refused.headers["retry-after"]) > 0
    assert len(upstream.received) == 8
    assert units(rds, "rl:{provider:hf}:rpm") == 8  # the refused request made no call and is charged none
    # The other team still gets what is left, and then the provider's quota is spent: the upstream never
    # saw more than its 10 calls a minute.
    assert post(g, "k-b", {**fan, "n": 2}).status_code == 200
    assert len(upstream.received) == 10
    assert post(g, "k-b", {**fan, "n": 1}).status_code == 429
    assert len(upstream.received) == 10


def test_fan_out_no_bucket_can_hold_is_400_naming_the_field(g: GatewayThread, upstream: Upstream) -> None:
    for field, payload in (
        ("n", {"n": 11}),
        ("prompt", {"prompt": ["test"] * 11}),
    ):
        resp = post(g, "k-a", {"model": "hf/m", "prompt": "test", "max_tokens": 1, **payload})
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert (err["param"], err["code"]) == (field, "exceeds_request_limit")
        assert "11 upstream calls" in err["message"] and "rpm limit of 10" in err["message"]
    assert upstream.received == []


def test_streamed_prompt_list_charges_the_deployment_per_call(
    g: GatewayThread, rds: RedisServer, upstream: Upstream
) -> None:
    resp = post(g, "k-a", {"model": "dep/m/east", "prompt": ["a", "b", "c"], "max_tokens": 1, "stream": True})
    assert resp.status_code == 200, resp.text
    assert len(upstream.received) == 3
    assert units(rds, "rl:{deployment:dep/east}:rpm") == 3
    # One call is left of rpm 4: two prompts are refused whole, one is served.
    two = post(g, "k-b", {"model": "dep/m/east", "prompt": ["a", "b"], "max_tokens": 1, "stream": True})
    assert two.status_code == 429, two.text
    assert len(upstream.received) == 3
    assert post(g, "k-b", {"model": "dep/m/east", "prompt": "a", "max_tokens": 1}).status_code == 200
    assert len(upstream.received) == 4


def test_alias_moves_on_when_a_target_cannot_take_the_whole_fan_out(
    g: GatewayThread, rds: RedisServer, upstream: Upstream
) -> None:
    # hf has room for 10, not for 11 more: the fan-out goes to the next target with no call made on hf.
    assert post(g, "k-a", {"model": "hf/m", "prompt": "test", "max_tokens": 1, "n": 9}).status_code == 200
    upstream.received.clear()
    resp = post(g, "k-b", {"model": "pair", "prompt": "test", "max_tokens": 1, "n": 2})
    assert resp.status_code == 200, resp.text
    assert len(upstream.received) == 2
    # No call was made on hf, and none is charged there: the unit its admission took is given back.
    assert units(rds, "rl:{provider:hf}:rpm") == 9


def test_guided_retries_are_charged_as_they_are_made(g: GatewayThread, upstream: Upstream) -> None:
    # llama.cpp has no guided_regex: the gateway checks each answer and asks again (guided_retries: 2).
    # rpm 2 holds the first call and one retry; the second retry is refused before it is made.
    resp = post(g, "k-a", {"model": "llama/m", "prompt": "yes or no?", "max_tokens": 1, "guided_regex": "yes"})
    assert resp.status_code == 429, resp.text
    assert resp.json()["error"]["code"] == "provider_quota"
    assert len(upstream.received) == 2


def test_calls_refused_before_they_are_sent_are_given_back(
    g: GatewayThread, rds: RedisServer, upstream: Upstream
) -> None:
    # TGI takes no `suffix`: each of the four sub-calls is refused (400 naming it) before it is sent. The three
    # charged beyond admission's one are given back; admission's stays, as for any request refused after it.
    resp = post(g, "k-a", {"model": "hf/m", "prompt": "test", "max_tokens": 1, "n": 4, "suffix": "}"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "suffix"
    assert upstream.received == []
    wait_until(lambda: units(rds, "rl:{provider:hf}:rpm") == 1)
    assert post(g, "k-b", {"model": "hf/m", "prompt": "test", "max_tokens": 1, "n": 9}).status_code == 200


def test_chat_fan_out_charges_each_call(g: GatewayThread, rds: RedisServer, upstream: Upstream) -> None:
    """TGI's Messages API has no `n`: a chat request for three choices is three calls, charged before the first."""
    chat = {"model": "hf/m", "messages": [{"role": "user", "content": "test"}], "max_tokens": 1, "n": 3}
    with client(g.url, "k-a") as c:
        resp = c.post("/v1/chat/completions", json=chat)
        assert resp.status_code == 200, resp.text
        assert [ch["index"] for ch in resp.json()["choices"]] == [0, 1, 2]
        assert len(upstream.received) == 3
        assert units(rds, "rl:{provider:hf}:rpm") == 3
        # Seven are left of rpm 10: a fan-out of eight is refused whole, before any of its calls.
        refused = c.post("/v1/chat/completions", json={**chat, "n": 8})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "provider_quota"
    assert len(upstream.received) == 3
