"""Prompt prefixes are scoped by key (a provider's `prefix_scope`, docs/fleets.md): two tenants whose prompts share
a prefix are placed on the ring independently, and an engine that takes a prefix-cache salt gets one of the
tenant's, which no other tenant can make its own, so neither the replica a prefix lands on nor the engine's
cache tells one tenant what another sent. `team` shares both within a team, `shared` among every caller."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from gateway.config import ConfigError, parse_config
from tests.helpers.redis import RedisServer
from tests.helpers.servers import serve_config
from tests.helpers.upstreams import Received, Upstream

from .conftest import completion, fleet_config

ALPHA, BETA, GAMMA = "gk-alpha-prefix-5d03", "gk-beta-prefix-a871", "gk-gamma-prefix-19c6"
KEYS = f"""keys:
  - {{name: alpha, key: "{ALPHA}", team: red}}
  - {{name: beta, key: "{BETA}", team: blue}}
  - {{name: gamma, key: "{GAMMA}", team: red}}
teams: {{red: {{}}, blue: {{}}}}
"""
SHARED = "You are a careful assistant. Answer in one word. Context: the sky is blue because of scattering. " * 12
COMPLETIONS = "/v1/completions"
HEX_SALT = re.compile(r"[0-9a-f]{32}")


def homes(gw_url: str, secret: str) -> list[int]:
    """The replica each of twelve prefixes lands on for one key (each asked with two tails: a prefix sticks)."""
    out: list[int] = []
    with httpx.Client(base_url=gw_url, trust_env=False, timeout=15) as c:
        for i in range(12):
            got = set()
            for tail in ("first question?", "second question?"):
                body = {"model": "engine/m", "prompt": f"[doc {i}] {SHARED} {tail}"}
                r = c.post("/v1/completions", json=body, headers={"authorization": f"Bearer {secret}"})
                assert r.status_code == 200, r.text
                got.add(int(r.headers["x-gateway-model"].split("@")[1].split("/")[0]))
            assert len(got) == 1, (i, got)
            out.append(got.pop())
    return out


def test_two_keys_sharing_a_prefix_are_placed_apart_unless_the_operator_shares_prefixes(
    tmp_path: Path, replicas: list[Upstream]
) -> None:
    with serve_config(tmp_path, fleet_config(replicas, "policy: prefix") + KEYS) as gw:
        alpha, beta = homes(gw.url, ALPHA), homes(gw.url, BETA)
        # Each key's prefixes are hashed with its identity: the same twelve prefixes land independently, so beta
        # cannot learn from `x-gateway-model` (or from a replica's warm cache) which prefixes alpha sends.
        assert alpha != beta, (alpha, beta)
        assert len(set(alpha)) > 1 and len(set(beta)) > 1  # and each key's own prefixes still spread
    with serve_config(tmp_path, fleet_config(replicas, "policy: prefix", prefix_scope="team") + KEYS) as gw:
        alpha, beta, gamma = homes(gw.url, ALPHA), homes(gw.url, BETA), homes(gw.url, GAMMA)
        assert alpha == gamma and alpha != beta, (alpha, beta, gamma)
    with serve_config(tmp_path, fleet_config(replicas, "policy: prefix", prefix_scope="shared") + KEYS) as gw:
        assert homes(gw.url, ALPHA) == homes(gw.url, BETA) == homes(gw.url, GAMMA)


def _event(text: str, finish: str | None = None) -> bytes:
    event = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
    event["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
    return b"data: " + json.dumps(event).encode() + b"\n\n"


CHAT = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
).encode()


async def engine(request: web.Request, received: Received) -> web.StreamResponse:
    """A vLLM (or SGLang) replica: a completion, a chat completion, or a completion stream."""
    if received.path.endswith("/chat/completions"):
        return web.Response(body=CHAT, content_type="application/json")
    if not received.json().get("stream"):
        return web.Response(body=completion(), content_type="application/json")
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_event("o"))
    await resp.write(_event("k", "stop"))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


class Engines:
    """What the replicas of one fleet received, newest last, over every replica."""

    def __init__(self, ups: list[Upstream]) -> None:
        self.ups = ups
        for u in ups:
            u.handler = engine

    def sent(self, gw_url: str, secret: str | None, path: str = COMPLETIONS, **fields: Any) -> dict[str, Any]:
        """The body the engine received for one request (a completion of `fields`)."""
        before = [len(u.received) for u in self.ups]
        body: dict[str, Any] = {"model": "engine/m", "prompt": "the same prompt", **fields}
        if path.endswith("/chat/completions"):
            body = {"model": "engine/m", "messages": [{"role": "user", "content": "the same prompt"}], **fields}
        headers = {"authorization": f"Bearer {secret}"} if secret else {}
        with httpx.Client(base_url=gw_url, trust_env=False, timeout=15) as c:
            r = c.post(path, json=body, headers=headers)
            assert r.status_code == 200, r.text
            r.read()
        new = [rec for u, n in zip(self.ups, before, strict=True) for rec in u.received[n:]]
        assert len(new) == 1, new
        sent: dict[str, Any] = new[0].json()
        return sent

    def salt(self, gw_url: str, secret: str | None, path: str = COMPLETIONS, **fields: Any) -> str | None:
        salt: str | None = self.sent(gw_url, secret, path, **fields).get("cache_salt")
        return salt


def test_each_key_has_an_engine_salt_of_its_own_that_no_other_key_can_send(
    tmp_path: Path, replicas: list[Upstream]
) -> None:
    engines = Engines(replicas)
    # Round robin: the salt is the tenant's under every policy, wherever its requests land.
    config = fleet_config(replicas, "policy: round_robin") + KEYS
    with serve_config(tmp_path, config) as gw:
        a = engines.salt(gw.url, ALPHA)
        assert a is not None and HEX_SALT.fullmatch(a), a  # a digest: neither the key's secret nor its name
        assert [engines.salt(gw.url, ALPHA) for _ in range(3)] == [a] * 3  # every replica: one salt per tenant
        b = engines.salt(gw.url, BETA)
        assert b is not None and b != a
        assert engines.salt(gw.url, ALPHA, "/v1/chat/completions") == a  # chat shares the tenant's cache
        assert engines.salt(gw.url, ALPHA, stream=True) == a  # so does a stream
        # A tenant's own salt still keeps its requests apart, within its own: never another tenant's salt.
        run = engines.salt(gw.url, ALPHA, cache_salt="run-17")
        assert run is not None and HEX_SALT.fullmatch(run) and run not in (a, b)
        assert engines.salt(gw.url, ALPHA, cache_salt="run-17") == run
        assert engines.salt(gw.url, BETA, cache_salt="run-17") not in (a, b, run)
        # Beta, having learned alpha's salts, sends them as its own, in the field or in the escape hatch: its
        # requests never carry them, so they can never read alpha's cache entries.
        for stolen in (a, run):
            assert engines.salt(gw.url, BETA, cache_salt=stolen) not in (a, b, run)
            sent = engines.sent(gw.url, BETA, inference_extra_params={"cache_salt": stolen, "top_k": 5})
            assert sent["cache_salt"] not in (a, b, run) and sent["top_k"] == 5
            both: dict[str, Any] = {"cache_salt": "mine", "inference_extra_params": {"cache_salt": stolen}}
            assert engines.salt(gw.url, BETA, **both) not in (a, b, run)
        # Nor can it send none: a null in the escape hatch is no salt of its own, so it gets its key's.
        assert engines.salt(gw.url, BETA, inference_extra_params={"cache_salt": None}) == b
    # The salt is derived, not drawn: another gateway process (a restart, another worker) sends the same.
    with serve_config(tmp_path, config) as gw:
        assert engines.salt(gw.url, ALPHA) == a
        assert engines.salt(gw.url, ALPHA, cache_salt="run-17") == run


def test_a_team_shares_its_salt_and_a_shared_scope_or_an_open_gateway_sends_the_clients_own(
    tmp_path: Path, replicas: list[Upstream]
) -> None:
    engines = Engines(replicas)
    with serve_config(tmp_path, fleet_config(replicas, "", prefix_scope="team") + KEYS) as gw:
        alpha, gamma, beta = engines.salt(gw.url, ALPHA), engines.salt(gw.url, GAMMA), engines.salt(gw.url, BETA)
        assert alpha is not None and alpha == gamma and alpha != beta
    for config, key in (
        (fleet_config(replicas, "", prefix_scope="shared") + KEYS, ALPHA),
        (fleet_config(replicas, "policy: prefix"), None),  # no client keys: one caller, nothing to keep apart
    ):
        with serve_config(tmp_path, config) as gw:
            assert "cache_salt" not in engines.sent(gw.url, key)
            assert engines.salt(gw.url, key, cache_salt="run-17") == "run-17"
            assert engines.salt(gw.url, key, inference_extra_params={"cache_salt": "run-18"}) == "run-18"


def test_an_engine_that_takes_no_salt_is_sent_none_and_sglang_is_salted_like_vllm(
    tmp_path: Path, replicas: list[Upstream]
) -> None:
    engines = Engines(replicas)
    llamacpp = fleet_config(replicas, "policy: prefix").replace("kind: vllm", "kind: llamacpp") + KEYS
    with serve_config(tmp_path, llamacpp) as gw:
        assert "cache_salt" not in engines.sent(gw.url, ALPHA)
    sglang = fleet_config(replicas, "policy: prefix").replace("kind: vllm", "kind: sglang") + KEYS
    with serve_config(tmp_path, sglang) as gw:
        alpha, beta = engines.salt(gw.url, ALPHA), engines.salt(gw.url, BETA)
        assert alpha is not None and beta is not None and HEX_SALT.fullmatch(alpha) and alpha != beta


def _chat_event(content: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"role": "assistant", "content": content}, "finish_reason": finish}
    event = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


async def breaking(request: web.Request, received: Received) -> web.StreamResponse:
    """Breaks a stream after its first event; answers its continuation (text or chat) in full."""
    body = received.json()
    chat = received.path.endswith("/chat/completions")
    event = _chat_event if chat else _event
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    if not (body.get("continue_final_message") if chat else "first " in body["prompt"]):
        await resp.write(event("first "))
        assert request.transport is not None
        request.transport.abort()
        return resp
    await resp.write(event("end", "stop"))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def test_a_resumed_stream_carries_its_tenants_salt_to_the_replica_that_takes_it_over(
    tmp_path: Path, replicas: list[Upstream]
) -> None:
    engines = Engines(replicas)
    with serve_config(tmp_path, fleet_config(replicas, "policy: prefix") + KEYS) as gw:
        own = engines.salt(gw.url, ALPHA)
    for u in replicas:
        u.handler = breaking
    extra = "models:\n  - {name: resumed, targets: [{model: engine/m}], resume_streams: true}\n"
    config = fleet_config(replicas, "policy: least_outstanding", extra=extra) + KEYS
    with serve_config(tmp_path, config) as gw, httpx.Client(base_url=gw.url, trust_env=False, timeout=15) as c:
        for path, body in (
            ("/v1/completions", {"prompt": "p"}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "p"}]}),
        ):
            before = [len(u.received) for u in replicas]
            r = c.post(
                path, json={"model": "resumed", "stream": True, **body}, headers={"authorization": f"Bearer {ALPHA}"}
            )
            assert r.status_code == 200 and "end" in r.text and "error" not in r.text, r.text
            calls = [rec.json() for u, n in zip(replicas, before, strict=True) for rec in u.received[n:]]
            assert len(calls) == 2, calls  # the broken stream and its continuation, each on its replica
            assert [call.get("cache_salt") for call in calls] == [own, own], path


def single_config(engine: Upstream, scope: str = "", redis: str = "") -> str:
    """One vLLM server behind one `base_url` (no `replicas:`), shared by three keys. Alpha has a rate limit:
    with `redis`, its request's first upstream call is made while admission waits on Redis."""
    keys = KEYS.replace("team: red}\n  - {name: beta", "team: red, limits: {rpm: 100000}}\n  - {name: beta")
    assert "rpm" in keys
    return f"""
server: {{host: 127.0.0.1, port: 0}}
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
logging: {{requests: false}}
{f'redis: {{url: "{redis}"}}' if redis else ""}
providers:
  engine:
    kind: vllm
    discover: false
    models: [m]
    base_url: {engine.url}/v1
{f"    prefix_scope: {scope}" if scope else ""}
{keys}"""


def test_a_single_server_shared_by_tenants_gets_a_salt_per_tenant_that_no_other_tenant_can_send(
    tmp_path: Path, replicas: list[Upstream]
) -> None:
    engines = Engines(replicas[:1])
    with serve_config(tmp_path, single_config(replicas[0])) as gw:
        a, b = engines.salt(gw.url, ALPHA), engines.salt(gw.url, BETA)
        assert a is not None and b is not None and HEX_SALT.fullmatch(a) and HEX_SALT.fullmatch(b) and a != b
        assert engines.salt(gw.url, ALPHA, "/v1/chat/completions") == a
        assert engines.salt(gw.url, BETA, stream=True) == b
        run = engines.salt(gw.url, ALPHA, cache_salt="run-17")
        assert run is not None and HEX_SALT.fullmatch(run) and run not in (a, b)
        # Beta sends alpha's salts as its own: the engine receives neither, so beta reads none of alpha's entries.
        for stolen in (a, run):
            assert engines.salt(gw.url, BETA, cache_salt=stolen) not in (a, b, run)
            sent = engines.sent(gw.url, BETA, inference_extra_params={"cache_salt": stolen})
            assert sent["cache_salt"] not in (a, b, run)
    # The salts are the same as a fleet's replicas would send for the same tenants (one derivation).
    with serve_config(tmp_path, fleet_config(replicas, "policy: round_robin") + KEYS) as gw:
        assert Engines(replicas).salt(gw.url, ALPHA) == a


def test_a_request_made_ahead_while_admission_asks_redis_carries_its_tenants_salt(
    tmp_path: Path, replicas: list[Upstream], rds: RedisServer
) -> None:
    engines = Engines(replicas[:1])
    with serve_config(tmp_path, single_config(replicas[0])) as gw:
        own, run = engines.salt(gw.url, ALPHA), engines.salt(gw.url, ALPHA, cache_salt="run-17")
    assert own is not None and run is not None
    with serve_config(tmp_path, single_config(replicas[0], redis=rds.url)) as gw:
        assert [engines.salt(gw.url, ALPHA) for _ in range(3)] == [own] * 3
        assert engines.salt(gw.url, ALPHA, cache_salt="run-17") == run
        assert engines.salt(gw.url, ALPHA, "/v1/chat/completions") == own


def test_a_single_server_shares_its_cache_within_a_team_or_among_all_only_when_told(
    tmp_path: Path, replicas: list[Upstream]
) -> None:
    engines = Engines(replicas[:1])
    with serve_config(tmp_path, single_config(replicas[0], "team")) as gw:
        alpha, gamma, beta = engines.salt(gw.url, ALPHA), engines.salt(gw.url, GAMMA), engines.salt(gw.url, BETA)
        assert alpha is not None and alpha == gamma and alpha != beta
    with serve_config(tmp_path, single_config(replicas[0], "shared")) as gw:
        for key in (ALPHA, BETA):
            assert "cache_salt" not in engines.sent(gw.url, key)
            assert engines.salt(gw.url, key, cache_salt="run-17") == "run-17"
            assert engines.salt(gw.url, key, inference_extra_params={"cache_salt": "run-18"}) == "run-18"


def test_prefix_scope_is_the_providers_and_not_a_routing_setting() -> None:
    providers = "providers: {v: {kind: vllm, replicas: ['http://a/v1'], routing: {prefix_scope: team}}}"
    with pytest.raises(ConfigError) as info:
        parse_config(providers, env={})
    assert "providers.v.routing.prefix_scope" in str(info.value)
    loaded = parse_config("providers: {v: {kind: vllm, base_url: 'http://a/v1', prefix_scope: team}}", env={})
    assert loaded.providers["v"].prefix_scope == "team"
    assert (
        parse_config("providers: {v: {kind: vllm, base_url: 'http://a/v1'}}", env={}).providers["v"].prefix_scope
        == "key"
    )
