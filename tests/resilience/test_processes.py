"""Resilience over real sockets: the official OpenAI SDK against a served gateway, two gateway processes
sharing one real redis-server, and Redis going away (frozen, then dead) under them.

Gateways are `python -m gateway serve` child processes (GatewayProcess) or the app under uvicorn in a
thread (GatewayThread), from tests/helpers/servers.py; the redis-server listens on a free loopback port.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest
import redis as redis_sync

from gateway.config import replica_tag
from tests.helpers.clients import openai_client
from tests.helpers.faults import RECORDED_COMPLETION, RECORDED_TEXTS, FaultServer, rate_limited, reset, unavailable
from tests.helpers.pipelines import MODEL, PROMPT, config_yaml, key, same_but_id
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayProcess, GatewayThread

ORDERED_AB = """
  - name: smart
    strategy: ordered
    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}]
"""
BODY = {"model": "smart", "prompt": PROMPT, "max_tokens": 16}


def write_config(path: Path, faults: FaultServer, top: str) -> Path:
    path.write_text(config_yaml(faults, ORDERED_AB, top=top))
    return path


def test_openai_sdk_sees_failover_as_one_ordinary_answer(faults: FaultServer, tmp_path: Path) -> None:
    # Failing over at once: the same-target retry the default makes first is tests/clients/test_policy_*.
    path = write_config(tmp_path / "gateway.yaml", faults, "retries: {attempts: 3, same_target: 0}\n")
    with GatewayThread(path, {}) as gw, openai_client(gw.url + "/v1", "no-key-needed") as oai:
        # What one good upstream gives, for comparison.
        good = httpx.post(gw.url + "/v1/completions", json=BODY, trust_env=False, timeout=10)
        assert good.headers["x-gateway-model"] == key("alpha")

        faults["alpha"].script(unavailable())
        raw = oai.completions.with_raw_response.create(model="smart", prompt=PROMPT, max_tokens=16)
        completion = raw.parse()
        assert raw.headers["x-gateway-model"] == key("beta")
        assert raw.headers["x-gateway-provider"] == "beta"
        assert raw.headers["x-gateway-attempts"] == "2"
        assert same_but_id(raw.content)[0] == same_but_id(good.content)[0]
        assert completion.choices[0].text == RECORDED_COMPLETION["choices"][0]["text"]
        assert completion.choices[0].finish_reason == "length"
        assert completion.usage is not None
        usage = completion.usage
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (8, 16, 24)

        # Streaming: alpha resets the connection before answering; the SDK sees one clean stream from beta.
        gw.pipeline.health.reset()
        faults["alpha"].script(reset())
        with oai.completions.with_streaming_response.create(
            model="smart", prompt=PROMPT, max_tokens=16, stream=True
        ) as resp:
            assert resp.headers["x-gateway-model"] == key("beta")
            assert resp.headers["x-gateway-attempts"] == "2"
            chunks = list(resp.parse())
        assert [c.choices[0].text for c in chunks] == RECORDED_TEXTS
        assert [c.choices[0].finish_reason for c in chunks][-1] == "length"
        assert len({c.id for c in chunks}) == 1
    assert faults.order() == ["alpha", "alpha", "beta", "alpha", "beta"]


def test_all_targets_cooling_over_http(faults: FaultServer, tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "gateway.yaml", faults, "retries: {attempts: 2, same_target: 0}\ncooldown: {min_requests: 1}\n"
    )
    faults["alpha"].script(unavailable(retry_after="5"))
    faults["beta"].script(rate_limited(retry_after_ms="2500"))
    with GatewayThread(path, {}) as gw, openai_client(gw.url + "/v1", "no-key-needed") as oai:
        with pytest.raises(openai.RateLimitError) as first:
            oai.completions.create(model="smart", prompt=PROMPT, max_tokens=16)
        assert first.value.response.headers["x-gateway-attempts"] == "2"
        assert first.value.response.headers["retry-after"] == "3"  # 2.5 s, rounded up
        assert first.value.response.headers["retry-after-ms"] == "2500"
        assert first.value.response.headers["x-should-retry"] == "false"  # the gateway spent its attempts
        with pytest.raises(openai.InternalServerError) as cooling:
            oai.completions.create(model="smart", prompt=PROMPT, max_tokens=16)
    resp = cooling.value.response
    assert resp.status_code == 503
    # Soonest recovery: beta's 2.5 s (less the time since), rounded up to whole seconds.
    assert resp.headers["retry-after"] == "3"
    assert resp.headers["x-should-retry"] == "true"  # nothing was called: a client's retry then gets a target
    assert resp.headers["x-gateway-attempts"] == "0"
    assert resp.json() == {
        "error": {
            "message": "Every target for this model is cooling down after failures; retry later",
            "type": "service_unavailable",
            "param": None,
            "code": "all_targets_cooling",
        }
    }
    assert faults.order() == ["alpha", "beta"]


def test_two_gateway_processes_agree_on_cooldowns_through_one_redis(
    faults: FaultServer, tmp_path: Path, redis: RedisServer
) -> None:
    top = (
        f"redis: {{url: '{redis.url}'}}\nretries: {{attempts: 3}}\n"
        "cooldown: {base_ms: 1000, max_ms: 60000, min_requests: 1}\n"
    )
    one = GatewayProcess(write_config(tmp_path / "one.yaml", faults, top))
    two = GatewayProcess(write_config(tmp_path / "two.yaml", faults, top))
    try:
        one.wait_ready()
        two.wait_ready()
        with httpx.Client(trust_env=False, timeout=10) as http:
            for gw in (one, two):
                ready = http.get(gw.url + "/ready")
                assert (ready.status_code, ready.json()) == (200, {"status": "ready", "redis": "ok"})
            # Gateway one meets a failing alpha: it fails over to beta and cools alpha for 30 s.
            faults["alpha"].script(unavailable(retry_after="30"))
            first = http.post(one.url + "/v1/completions", json=BODY)
            assert first.status_code == 200
            assert (first.headers["x-gateway-model"], first.headers["x-gateway-attempts"]) == (key("beta"), "2")
            store = redis_sync.Redis.from_url(redis.url)
            try:
                # A target goes by the server it calls: its provider, the hash of its URL, its model.
                cd = "gw:{alpha@" + replica_tag(faults["alpha"].base_url) + "/" + MODEL + "}:cd"
                assert store.get(cd) == b"error"
                assert 25_000 < store.pttl(cd) <= 30_000
            finally:
                store.close()
            # Gateway two has never seen alpha fail, yet skips it: alpha receives nothing from it.
            for _ in range(3):
                second = http.post(two.url + "/v1/completions", json=BODY)
                assert second.status_code == 200
                assert second.headers["x-gateway-model"] == key("beta")
                assert second.headers["x-gateway-provider"] == "beta"
                assert second.headers["x-gateway-attempts"] == "1"
                assert same_but_id(second.content)[0] == same_but_id(first.content)[0]
            streamed = http.post(two.url + "/v1/completions", json={**BODY, "stream": True})
            assert streamed.headers["x-gateway-model"] == key("beta")
        assert faults.order() == ["alpha", "beta", "beta", "beta", "beta", "beta"]
        assert faults["alpha"].count == 1
    finally:
        one.stop()
        two.stop()


def test_requests_never_wait_on_a_frozen_or_dead_redis(faults: FaultServer, tmp_path: Path, redis: RedisServer) -> None:
    top = f"redis: {{url: '{redis.url}'}}\nretries: {{attempts: 3}}\ncooldown: {{min_requests: 1}}\n"
    gw = GatewayProcess(write_config(tmp_path / "gateway.yaml", faults, top))
    try:
        gw.wait_ready()
        with httpx.Client(trust_env=False, timeout=10) as http:

            def timed(**extra: object) -> tuple[httpx.Response, float]:
                start = time.monotonic()
                resp = http.post(gw.url + "/v1/completions", json={**BODY, **extra})
                return resp, time.monotonic() - start

            assert timed()[0].status_code == 200  # connections to Redis are open and in use
            # Frozen: connections stay open but nothing answers (the worst case for a client).
            os.kill(redis.proc.pid, signal.SIGSTOP)
            for extra in ({}, {"stream": True}, {}):
                resp, took = timed(**extra)
                assert resp.status_code == 200, resp.text
                assert took < 1.5, took
            ready = http.get(gw.url + "/ready")
            assert (ready.status_code, ready.json()) == (503, {"status": "degraded", "redis": "unreachable"})
            # Cooldowns keep working on in-process state meanwhile.
            faults["alpha"].script(unavailable(retry_after="30"))
            resp, took = timed()
            assert (resp.headers["x-gateway-model"], resp.headers["x-gateway-attempts"]) == (key("beta"), "2")
            resp, took = timed()
            assert (resp.headers["x-gateway-model"], resp.headers["x-gateway-attempts"]) == (key("beta"), "1")
            assert took < 1.5
            # Redis answers again: /ready says so (the retry happens at most once a second).
            os.kill(redis.proc.pid, signal.SIGCONT)
            deadline = time.monotonic() + 3
            while http.get(gw.url + "/ready").status_code != 200:
                assert time.monotonic() < deadline, "the gateway did not reconnect to redis"
                time.sleep(0.1)
            # Dead: connections are refused.
            redis.stop()
            for extra in ({}, {"stream": True}):
                resp, took = timed(**extra)
                assert resp.status_code == 200, resp.text
                assert took < 1.5, took
            ready = http.get(gw.url + "/ready")
            assert (ready.status_code, json.loads(ready.content)) == (
                503,
                {"status": "degraded", "redis": "unreachable"},
            )
    finally:
        gw.stop()
    log = gw.log.read_text()
    assert log.count("redis unreachable") == 1, log  # warned once, not once per request
