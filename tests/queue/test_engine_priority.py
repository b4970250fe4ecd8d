"""The body's `priority` (a self-hosted engine's own scheduling order) is sent only for keys that may ask
for `high`: any other key would jump the engine's queue past every tenant the gateway ranks above it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.helpers.engine import Engine
from tests.helpers.servers import serve_config
from tests.queue.conftest import body, chat_body, config

TOP = -(2**31)  # the engine's most urgent value


@pytest.mark.parametrize("cap", [4, "null"])  # with and without a queue in front of the server
async def test_only_a_key_that_may_ask_for_high_sets_the_engines_priority(
    tmp_path: Path, engine: Engine, cap: int | str
) -> None:
    with serve_config(tmp_path, config(engine, cap)) as gw:
        assert (gw.pipeline.queues is None) == (cap == "null")
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:

            async def send(key: str, path: str, payload: dict[str, object]) -> httpx.Response:
                return await client.post(path, json=payload, headers={"authorization": f"Bearer k-{key}"})

            refused = [
                await send("batch", "/v1/completions", body("batch", priority=TOP)),  # defaults to low
                await send("noisy", "/v1/completions", body("noisy", priority=TOP)),  # normal at most
                await send("noisy", "/v1/chat/completions", chat_body("noisy", priority=-5)),
                await send("noisy", "/v1/completions", body("noisy", priority=0)),
            ]
            allowed = [
                await send("boss", "/v1/completions", body("boss", priority=TOP)),
                await send("boss", "/v1/chat/completions", chat_body("boss", priority=-5)),
                await send("noisy", "/v1/completions", body("noisy")),  # no priority: as before
            ]
    for r in refused:
        assert r.status_code == 403, r.text
        error = r.json()["error"]
        assert (error["code"], error["param"]) == ("priority_not_allowed", "priority")
        assert "max_priority is 'normal'" in error["message"]
    assert [r.status_code for r in allowed] == [200] * 3
    assert [r.json().get("priority") for r in engine.received] == [TOP, -5, None]  # nothing refused reached it
