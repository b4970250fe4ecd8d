"""`max_concurrency`: a server never has more requests in flight from the gateway than its cap, streams
counted to their last byte; without Redis per process, with Redis across gateways."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from gateway.config import parse_config
from gateway.path.pipeline import Pipeline
from tests.helpers.engine import Engine
from tests.helpers.faults import CHUNKS, FaultServer, continuation, cut, openai_error, stream
from tests.helpers.pipelines import VirtualTime, config_yaml
from tests.helpers.pipelines import ask as ask_pipeline
from tests.helpers.redis import RedisServer
from tests.helpers.servers import GatewayProcess, serve_config
from tests.queue.conftest import ask, body, chat_body, config, gate, provider, streamed, until


async def test_the_cap_holds_for_buffered_requests_and_streams_to_their_last_byte(
    tmp_path: Path, engine: Engine
) -> None:
    engine.hold_s = 0.05
    with serve_config(tmp_path, config(engine, 2)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:

            async def streamed(i: int) -> httpx.Response:
                return await client.post(
                    "/v1/completions",
                    json=body("quiet", stream=True),
                    headers={"authorization": "Bearer k-quiet"},
                )

            answers = await asyncio.gather(*(ask(client, "noisy") for _ in range(8)), *(streamed(i) for i in range(8)))
    assert [r.status_code for r in answers] == [200] * 16
    assert all(r.text.rstrip().endswith("data: [DONE]") for r in answers[8:])
    assert engine.peak == 2  # reached, never passed
    assert len(engine.order) == 16


async def test_chat_requests_hold_the_same_slots_as_completions(tmp_path: Path, engine: Engine) -> None:
    """Chat, buffered and streamed to its last byte, waits for the same server's slots as completions do."""
    engine.hold_s = 0.05
    with serve_config(tmp_path, config(engine, 2)) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            hdrs = {"authorization": "Bearer k-quiet"}
            chats = [client.post("/v1/chat/completions", json=chat_body("quiet"), headers=hdrs) for _ in range(6)]
            streams = [
                client.post("/v1/chat/completions", json=chat_body("quiet", stream=True), headers=hdrs)
                for _ in range(4)
            ]
            answers = await asyncio.gather(*chats, *streams, *(ask(client, "noisy") for _ in range(6)))
            assert gate(gw).in_use == 0
    assert [r.status_code for r in answers] == [200] * 16
    assert [r.json()["object"] for r in answers[:6]] == ["chat.completion"] * 6
    assert all('"chat.completion.chunk"' in r.text and r.text.rstrip().endswith("data: [DONE]") for r in answers[6:10])
    assert engine.peak == 2  # reached, never passed
    assert engine.order.count("quiet") == 10 and engine.order.count("noisy") == 6


async def test_a_provider_without_max_concurrency_builds_no_queue(tmp_path: Path, engine: Engine) -> None:
    text = config(engine, 1).replace("    max_concurrency: 1\n", "")
    with serve_config(tmp_path, text) as gw:
        assert gw.pipeline.queues is None
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            engine.running.clear()  # the engine holds each request until all six have reached it
            sent = asyncio.gather(*(ask(client, "noisy") for _ in range(6)))
            await until(lambda: engine.inflight == 6)
            engine.running.set()
            answers = await sent
    assert [r.status_code for r in answers] == [200] * 6
    assert engine.peak == 6  # every request went at once: nothing held them back


@pytest.mark.parametrize("cap", [3, 16])  # 16: far below it, each gateway takes its leases in blocks
async def test_two_gateways_sharing_redis_hold_one_cap(tmp_path: Path, rds: RedisServer, cap: int) -> None:
    url = rds.url
    each = 10 if cap < 16 else 30
    with Engine(hold_s=0.05 if cap < 16 else 0.2) as engine:
        # fail_closed: exact only while Redis answers, which fail_open does not wait for on a loaded machine.
        text = config(engine, cap, extra=f"redis: {{url: '{url}', on_failure: fail_closed}}")
        with serve_config(tmp_path, text) as a, serve_config(tmp_path, text) as b:
            async with (
                httpx.AsyncClient(base_url=a.url, timeout=30) as ca,
                httpx.AsyncClient(base_url=b.url, timeout=30) as cb,
            ):
                if cap >= 16:  # one request each first, far from full: a block each
                    assert [(await ask(c, "quiet")).status_code for c in (ca, cb)] == [200, 200]
                    assert gate(a).blocks == 1 and gate(b).blocks == 1
                answers = await asyncio.gather(
                    *(ask(ca, "noisy") for _ in range(each)),
                    *(ask(cb, "quiet") for _ in range(each)),
                    *(streamed(ca, "quiet") for _ in range(4)),
                )
            assert gate(a).in_use == 0 and gate(b).in_use == 0
    assert [r.status_code for r in answers] == [200] * (2 * each + 4)
    assert cap // 2 < engine.peak <= cap  # past what blocks may hold: per-request leases near the cap


async def test_each_replica_has_its_own_cap(tmp_path: Path) -> None:
    with Engine(hold_s=0.05) as one, Engine(hold_s=0.05) as two:
        text = config(one, 1).replace(
            f"    base_url: {one.url}/v1\n",
            f"    replicas: [{{url: {one.url}/v1}}, {{url: {two.url}/v1, max_concurrency: 3}}]\n"
            "    routing: {policy: least_outstanding}\n",
        )
        with serve_config(tmp_path, text) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                answers = await asyncio.gather(*(ask(client, "noisy") for _ in range(16)))
            assert gate(gw, "engine@0").cap == 1 and gate(gw, "engine@1").cap == 3
    assert [r.status_code for r in answers] == [200] * 16
    assert (one.peak, two.peak) == (1, 3)
    assert len(one.order) + len(two.order) == 16


_HEDGED = """models:
  - name: hedged
    strategy: ordered
    hedge_after_ms: 30
    targets: [{model: engine/m}, {model: spare/m}]
retries: {attempts: 3, initial_backoff_ms: 0, max_backoff_ms: 0}
"""


async def _hedged(client: httpx.AsyncClient) -> list[httpx.Response]:
    """Twelve buffered and four streamed requests to the hedged alias, all at once."""
    req = {"model": "hedged", "prompt": "noisy hello", "max_tokens": 1}
    hdrs = {"authorization": "Bearer k-noisy"}
    return await asyncio.gather(
        *(client.post("/v1/completions", json=req, headers=hdrs) for _ in range(12)),
        *(client.post("/v1/completions", json={**req, "stream": True}, headers=hdrs) for _ in range(4)),
    )


async def test_hedges_and_retries_each_hold_a_slot(tmp_path: Path) -> None:
    # A hedge's loser is cancelled by closing its connection: counted gone once the engine has read that.
    with Engine(hold_s=0.15, settle=True) as slow, Engine(hold_s=0.02, settle=True) as fast:
        text = config(slow, 2, provider=provider("spare", fast, 2), extra=_HEDGED).replace(
            "retries: {attempts: 1}\n", ""
        )
        slow.failures = 3  # the first attempts fail and are retried
        with serve_config(tmp_path, text) as gw:
            async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                answers = await _hedged(client)
            await until(lambda: gate(gw).in_use == 0 and gate(gw, "spare").in_use == 0)
    assert [r.status_code for r in answers] == [200] * 16
    assert slow.peak == 2 and fast.peak == 2  # both served, neither past its cap
    assert len(slow.order) + len(fast.order) > 16  # hedges and retries made more calls than requests


async def test_two_gateways_sharing_redis_hold_one_cap_with_hedges_retries_and_streams(
    tmp_path: Path, rds: RedisServer
) -> None:
    with Engine(hold_s=0.15, settle=True) as slow, Engine(hold_s=0.02, settle=True) as fast:
        # fail_closed: a Redis answer slower than its deadline on this loaded machine would otherwise let each
        # gateway decide on its own count (fail_open, the default, is per process while Redis does not answer).
        redis = f"redis: {{url: '{rds.url}', on_failure: fail_closed}}"
        text = config(slow, 2, provider=provider("spare", fast, 2), extra=_HEDGED + redis)
        text = text.replace("retries: {attempts: 1}\n", "")
        slow.failures = 4  # the first attempts fail and are retried, on either gateway
        with serve_config(tmp_path, text) as a, serve_config(tmp_path, text) as b:
            async with (
                httpx.AsyncClient(base_url=a.url, timeout=30) as ca,
                httpx.AsyncClient(base_url=b.url, timeout=30) as cb,
            ):
                answers = [*(await asyncio.gather(_hedged(ca), _hedged(cb)))]
            for gw in (a, b):
                await until(lambda gw=gw: gate(gw).in_use == 0 and gate(gw, "spare").in_use == 0)
    assert [r.status_code for rs in answers for r in rs] == [200] * 32
    assert slow.peak == 2 and fast.peak == 2  # one cap per server across both gateways, not one each
    assert len(slow.order) + len(fast.order) > 32  # hedges and retries made more calls than requests


@pytest.mark.parametrize("shared", [True, False])
async def test_two_workers_hold_one_cap_with_redis_and_one_each_without(
    tmp_path: Path, rds: RedisServer, shared: bool
) -> None:
    with Engine(hold_s=0.08) as engine:
        text = config(engine, 3, extra=f"redis: {{url: '{rds.url}'}}" if shared else "")
        path = tmp_path / "workers.yaml"
        path.write_text(text.replace("server: {host: 127.0.0.1, port: 0}", "server: {host: 127.0.0.1, workers: 2}"))
        gw = GatewayProcess(path)
        try:
            gw.wait_ready()
            async with httpx.AsyncClient(base_url=gw.url, timeout=30, trust_env=False) as client:
                for _ in range(3):  # new connections each round, so both workers take some
                    answers = await asyncio.gather(
                        *(ask(client, "noisy") for _ in range(12)),
                        *(streamed(client, "quiet") for _ in range(4)),
                    )
                    assert [r.status_code for r in answers] == [200] * 16
        finally:
            gw.stop()
    if shared:
        assert engine.peak == 3
    else:
        assert 3 <= engine.peak <= 6  # per process: each worker keeps its own three


def _resuming(faults: FaultServer, attempts: int) -> str:
    """A config of alias `smart` over `alpha` then `beta`, resuming broken streams."""
    models = """  - name: smart
    strategy: ordered
    resume_streams: true
    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}]
"""
    top = f"retries: {{attempts: {attempts}}}\ntimeouts: {{connect_ms: 1000, first_byte_ms: 300, total_ms: 5000}}\n"
    return config_yaml(faults, models, top=top, providers=("alpha", "beta"))


async def test_a_resumed_stream_holds_a_slot_of_its_own_where_it_resumes(faults: FaultServer) -> None:
    """A stream broken mid-way and resumed on another target: the continuation takes (and gives back) a
    slot of the server it resumes on, as the same tenant."""
    text = _resuming(faults, attempts=3)
    text = text.replace("/v1}", "/v1, max_concurrency: 1}")
    assert text.count("max_concurrency: 1") == 2
    faults["alpha"].script(cut(5))
    faults["beta"].script(continuation(prompt_tokens=8 + 5))
    vtime = VirtualTime()
    p = Pipeline(parse_config(text, "queue.yaml", env={}), sleep=vtime.sleep, clock=vtime.clock)
    try:
        answer = await ask_pipeline(p, stream=True, stream_options={"include_usage": True})
        assert p.queues is not None
        alpha, beta = (next(g for g in p.queues.gates.values() if g.name == n) for n in ("alpha", "beta"))
        await until(lambda: alpha.in_use == 0 and beta.in_use == 0)  # both given back at the stream's end
    finally:
        await p.close()
    assert faults.order() == ["alpha", "beta"]
    assert len(answer.chunks()) == 17  # sixteen content chunks and the usage, one stream
    assert (alpha.order.turn, beta.order.turn) == (1, 1)  # the continuation was granted beta's slot
    assert beta.order.service.keys() == alpha.order.service.keys() == {"anonymous"}  # as the same tenant


async def test_a_resumed_stream_is_charged_its_new_targets_quota(faults: FaultServer) -> None:
    """The continuation is an upstream call like any other: the provider it resumes on counts it against its
    own `limits:` (here one request a minute), so a second stream that breaks finds that quota spent and ends
    with its error event instead of calling the provider past it."""
    text = _resuming(faults, attempts=1)
    beta = next(line for line in text.splitlines() if line.startswith("  beta:"))
    text = text.replace(beta, beta[:-1] + ", limits: {rpm: 1}}")
    # An error event mid-way: evidence against alpha, not a cooldown, so the second stream starts there too.
    failed = b"data: " + openai_error("The server had an error while processing your request.", "server_error", None)
    faults["alpha"].script(then=stream(CHUNKS[:7] + [failed]))
    faults["beta"].script(then=continuation(prompt_tokens=8 + 7))
    vtime = VirtualTime()
    p = Pipeline(parse_config(text, "quota.yaml", env={}), sleep=vtime.sleep, clock=vtime.clock)
    try:
        resumed = await ask_pipeline(p, stream=True)
        broken = await ask_pipeline(p, stream=True)
    finally:
        await p.close()
    assert len(resumed.chunks()) == 16 and "error" not in resumed.body.decode()
    assert '"error"' in broken.body.decode() and broken.body.endswith(b"data: [DONE]\n\n")
    assert faults.order() == ["alpha", "beta", "alpha"]  # beta's quota refused the second continuation
