"""The real `Pipeline` in process over scripted targets, with injected time, and what it answered.

In-process tests build the real `Pipeline` from a real config and inject only time: `VirtualTime`
records every wait the failover loop asks for and advances a virtual clock by it instead of sleeping,
and the same clock drives cooldowns and deadlines. Upstream I/O, timeouts (aiohttp's) and everything
else are real.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from gateway.config import parse_config
from gateway.path.dialects import OPENAI
from gateway.path.pipeline import Pipeline
from gateway.resilience.health import TargetState
from tests.helpers.faults import FaultServer
from wire.errors import GatewayError

PROMPT: Final = "Tell me a joke about opentelemetry"
PROVIDERS: Final = ("alpha", "beta", "gamma", "delta", "omega")
MODEL: Final = "davinci-002"


class VirtualTime:
    """An injected clock and sleep: sleeping records the wait and moves the clock, at once.

    With `follow_wall`, the clock also runs with the wall clock (monotonic time plus every wait slept
    so far), for tests where real I/O time must count: deadlines across attempts, measured latencies.
    """

    def __init__(self, start: float = 1_000.0, *, follow_wall: bool = False) -> None:
        self.now = start
        self.follow_wall = follow_wall
        self._wall0 = time.monotonic()
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now + (time.monotonic() - self._wall0 if self.follow_wall else 0.0)

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        self.now += seconds


def key(provider: str) -> str:
    """The route key (`x-gateway-model`) of a provider's one model."""
    return f"{provider}/{MODEL}"


def config_yaml(server: FaultServer, models: str, *, top: str = "", providers: Sequence[str] = PROVIDERS) -> str:
    """A gateway config: one OpenAI-kind provider per scripted target, then `top` and `models` YAML."""
    lines = ["unsupported_params: error", "providers:"]
    for name in providers:
        lines.append(f"  {name}: {{kind: openai, api_key: sk-{name}, base_url: {server[name].base_url}}}")
    return "\n".join(lines) + "\n" + top.strip("\n") + "\n" + "models:\n" + models.strip("\n") + "\n"


def pipeline(server: FaultServer, vtime: VirtualTime, models: str, *, top: str = "") -> Pipeline:
    loaded = parse_config(config_yaml(server, models, top=top), "resilience.yaml", env={})
    return Pipeline(loaded, sleep=vtime.sleep, clock=vtime.clock)


@dataclass
class Answer:
    """What the client got: a body (a whole JSON answer or every SSE byte) and headers, or the error."""

    headers: dict[str, str]
    body: bytes
    error: GatewayError | None = None

    def json(self) -> Any:
        assert self.error is None, self.error
        return json.loads(self.body)

    @property
    def served_by(self) -> str:
        return self.headers["x-gateway-model"]

    @property
    def attempts(self) -> int:
        if self.error is not None:
            assert self.error.attempts is not None
            return self.error.attempts
        return int(self.headers["x-gateway-attempts"])

    def events(self) -> list[str]:
        """The `data:` payloads of a streamed answer, in order."""
        out: list[str] = []
        for event in self.body.decode().split("\n\n"):
            if event:
                assert event.startswith("data: "), event
                out.append(event[len("data: ") :])
        return out

    def chunks(self) -> list[Any]:
        events = self.events()
        assert events[-1] == "[DONE]", events[-1]
        return [json.loads(e) for e in events[:-1]]

    def text(self) -> str:
        return "".join(c["text"] for chunk in self.chunks() for c in chunk["choices"])

    def error_body(self) -> Any:
        """The error as the OpenAI dialect renders it."""
        assert self.error is not None
        return json.loads(OPENAI.error(self.error)[1])


def request_body(model: str = "smart", **extra: Any) -> bytes:
    return msgspec.json.encode({"model": model, "prompt": PROMPT, "max_tokens": 16, **extra})


async def ask(p: Pipeline, model: str = "smart", **extra: Any) -> Answer:
    """One request through the pipeline, as the app's handler makes it; a stream is read to its end."""
    try:
        result = await p.complete(request_body(model, **extra), {}, OPENAI)
    except GatewayError as exc:
        return Answer(headers={}, body=b"", error=exc)
    if result.stream is None:
        return Answer(headers=result.headers, body=result.body)
    body = b"".join([chunk async for chunk in result.stream])
    return Answer(headers=result.headers, body=body)


_ID: Final = re.compile(rb'"id":"cmpl-[0-9a-f]{24}"')


def same_but_id(body: bytes) -> tuple[bytes, set[bytes]]:
    """The body with the gateway's per-request completion id blanked, and the ids it contained."""
    ids = set(_ID.findall(body))
    return _ID.sub(b'"id":"cmpl-*"', body), ids


async def state(p: Pipeline, provider: str) -> TargetState:
    """A pipeline's view of one target's health now."""
    return (await p.health.snapshot([key(provider)]))[key(provider)]
