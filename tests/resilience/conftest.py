"""Fixtures for the resilience suite: virtual time and pipelines per test, over the root `faults` upstream."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import pytest

from gateway.path.pipeline import Pipeline
from tests.helpers.faults import FaultServer
from tests.helpers.pipelines import Answer, VirtualTime, ask, pipeline


@pytest.fixture
def vtime() -> VirtualTime:
    return VirtualTime()


@pytest.fixture(autouse=True)
def seeded_random() -> Iterator[None]:
    """Backoff jitter and weighted orders draw from `random`: make every test's draws reproducible."""
    state = random.getstate()
    random.seed(SEED)
    yield
    random.setstate(state)


MakePipeline = Callable[..., Pipeline]
SEED = 20240603


@dataclass
class Reference:
    plain: Answer
    stream: Answer


@pytest.fixture
async def make(faults: FaultServer, vtime: VirtualTime) -> AsyncIterator[MakePipeline]:
    """`make(models_yaml, top=..., time=...)`: a real Pipeline over the scripted targets, closed after the test.

    Time is the test's `vtime` unless another VirtualTime is given (one that follows the wall clock).
    """
    made: list[Pipeline] = []

    def build(models: str, *, top: str = "", time: VirtualTime | None = None) -> Pipeline:
        p = pipeline(faults, time or vtime, models, top=top)
        made.append(p)
        return p

    yield build
    for p in made:
        await p.close()


@pytest.fixture
async def reference(make: MakePipeline, faults: FaultServer) -> AsyncIterator[Reference]:
    """What one good upstream produces through the gateway for `smart`, plain and streamed."""
    p = make("  - name: smart\n    targets: [{model: omega/davinci-002}]\n")
    plain = await ask(p)
    streamed = await ask(p, stream=True)
    assert faults.order() == ["omega", "omega"]
    faults["omega"].hits.clear()
    faults.journal.clear()
    yield Reference(plain=plain, stream=streamed)
