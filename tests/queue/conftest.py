"""A loopback engine that counts what it has in flight, and a gateway with `max_concurrency` in front of it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from typing import Any

import httpx
import pytest

from gateway.queue.gate import Gate
from tests.helpers.engine import Engine
from tests.helpers.servers import GatewayThread

KEYS = """
keys:
  - {name: noisy, key: k-noisy}
  - {name: quiet, key: k-quiet}
  - {name: heavy, key: k-heavy, weight: 3}
  - {name: boss, key: k-boss, max_priority: high}
  - {name: batch, key: k-batch, priority: low}
  - {name: blocker, key: k-blocker, max_priority: high}
"""


@pytest.fixture
def engine() -> Iterator[Engine]:
    with Engine() as e:
        yield e


def config(engine: Engine, cap: int | str = 1, *, queue: str = "", extra: str = "", provider: str = "") -> str:
    return f"""
server: {{host: 127.0.0.1, port: 0}}
logging: {{requests: false}}
retries: {{attempts: 1}}
{KEYS}
providers:
  engine:
    kind: vllm
    base_url: {engine.url}/v1
    discover: false
    max_concurrency: {cap}
{provider}
queue: {{{queue}}}
{extra}"""


def body(tenant: str, tokens: int = 1, **extra: Any) -> dict[str, Any]:
    return {"model": "engine/m", "prompt": f"{tenant} hello there", "max_tokens": tokens, **extra}


def chat_body(tenant: str, tokens: int = 1, **extra: Any) -> dict[str, Any]:
    """The chat request of `tenant`: its one message starts with the tenant's name, as a prompt does."""
    return {"model": "engine/m", "messages": [{"role": "user", "content": f"{tenant} hello there"}], **extra} | {
        "max_completion_tokens": tokens
    }


async def ask(
    client: httpx.AsyncClient, key: str, tenant: str | None = None, tokens: int = 1, **headers: str
) -> httpx.Response:
    return await client.post("/v1/completions", json=body(tenant or key, tokens), headers=_headers(key, headers))


async def ask_chat(client: httpx.AsyncClient, key: str, **headers: str) -> httpx.Response:
    """`ask`, on the chat route."""
    return await client.post("/v1/chat/completions", json=chat_body(key), headers=_headers(key, headers))


def _headers(key: str, headers: dict[str, str]) -> dict[str, str]:
    return {"authorization": f"Bearer k-{key}", **{k.replace("_", "-"): v for k, v in headers.items()}}


def gate(gw: GatewayThread, name: str = "engine") -> Gate:
    queues = gw.pipeline.queues
    assert queues is not None
    return next(g for g in queues.gates.values() if g.name == name)


async def until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def hold_one(client: httpx.AsyncClient, engine: Engine, key: str = "noisy") -> asyncio.Future[httpx.Response]:
    """Stop the engine and send one request, which takes the one slot and stays in the engine until it runs."""
    engine.running.clear()
    held = asyncio.ensure_future(ask(client, key))
    await until(lambda: engine.inflight == 1)
    return held


def provider(name: str, engine: Engine, cap: int) -> str:
    """One more capped `vllm` provider in front of `engine`, for `config(provider=...)`."""
    return f"""  {name}:
    kind: vllm
    base_url: {engine.url}/v1
    discover: false
    max_concurrency: {cap}
"""


def streamed(client: httpx.AsyncClient, key: str) -> Awaitable[httpx.Response]:
    """A streamed request of `key` (the whole stream read: the slot is held to its last byte)."""
    return client.post("/v1/completions", json=body(key, stream=True), headers={"authorization": f"Bearer k-{key}"})
