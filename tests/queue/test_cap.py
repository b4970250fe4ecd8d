"""`max_concurrency`: a server never has more requests in flight from the gateway than its cap, streams
counted to their last byte; without Redis per process, with Redis across gateways."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.helpers.engine import Engine
from tests.helpers.servers import serve_config
from tests.queue.conftest import ask, body, config, gate


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


async def test_a_provider_without_max_concurrency_builds_no_queue(tmp_path: Path, engine: Engine) -> None:
    engine.hold_s = 0.05
    text = config(engine, 1).replace("    max_concurrency: 1\n", "")
    with serve_config(tmp_path, text) as gw:
        assert gw.pipeline.queues is None
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            answers = await asyncio.gather(*(ask(client, "noisy") for _ in range(6)))
    assert [r.status_code for r in answers] == [200] * 6
    assert engine.peak == 6  # every request went at once: nothing held them back


async def test_two_gateways_sharing_redis_hold_one_cap(tmp_path: Path, rds: object) -> None:
    url = rds.url  # type: ignore[attr-defined]
    with Engine(hold_s=0.05) as engine:
        text = config(engine, 3, extra=f"redis: {{url: '{url}'}}")
        with serve_config(tmp_path, text) as a, serve_config(tmp_path, text) as b:
            async with (
                httpx.AsyncClient(base_url=a.url, timeout=30) as ca,
                httpx.AsyncClient(base_url=b.url, timeout=30) as cb,
            ):
                answers = await asyncio.gather(
                    *(ask(ca, "noisy") for _ in range(10)),
                    *(ask(cb, "quiet") for _ in range(10)),
                    *(
                        ca.post(
                            "/v1/completions",
                            json=body("quiet", stream=True),
                            headers={"authorization": "Bearer k-quiet"},
                        )
                        for _ in range(4)
                    ),
                )
            assert gate(a).in_use == 0 and gate(b).in_use == 0
    assert [r.status_code for r in answers] == [200] * 24
    assert engine.peak == 3
