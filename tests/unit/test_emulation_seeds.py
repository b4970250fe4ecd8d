"""A fanned-out call's seed (gateway/emulation/seeds.py): each call of a seeded `n` or `best_of` takes the
request's seed plus its index, and a guided output asked again moves it on, so no two calls sample alike."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from gateway import emulation
from gateway.config import CapsConfig
from gateway.emulation import chat as chat_emulation
from gateway.emulation.client_schema import Work
from gateway.emulation.combine import checked
from gateway.emulation.planning import make_guide
from gateway.emulation.seeds import shifted
from gateway.path.chat_request import normalize_chat
from providers.registry import REGISTRY
from tests.unit.emulation_setup import ADAPTER, answer, req
from wire.chat import decode_chat
from wire.errors import UpstreamError
from wire.schema import Completion, CompletionRequest

CAPS = CapsConfig()


def test_a_seed_moves_on_within_int64() -> None:
    assert shifted(7, 2) == 9
    assert shifted(7, 0) == 7
    assert shifted(None, 3) is None
    assert shifted(2**63 - 1, 1) == -(2**63)  # wraps at the top of the range the gateway takes
    assert shifted(-1, 2) == 1


def test_each_call_of_a_prompt_takes_its_own_seed() -> None:
    asked = req(prompt=["a", "b"], n=3, seed=41)
    em = emulation.plan(ADAPTER, asked, "p", 2)
    assert em is not None and em.fan_n == 3
    subs = emulation.sub_requests(em, asked)
    assert [(s.prompt, s.seed) for s in subs] == [("a", 41), ("a", 42), ("a", 43), ("b", 41), ("b", 42), ("b", 43)]
    # Unseeded calls stay unseeded.
    assert {s.seed for s in emulation.sub_requests(em, req(prompt=["a", "b"], n=3))} == {None}


def test_each_chat_call_takes_its_own_seed() -> None:
    cls = REGISTRY["tgi"]
    assert cls.chat_params is not None
    body = {"model": "x/m", "messages": [{"role": "user", "content": "hi"}], "n": 3, "seed": 5}
    asked = normalize_chat(decode_chat(msgspec.json.encode(body)))
    em = chat_emulation.plan(cls(), cls.chat_params, asked, "p", CAPS)
    assert em is not None and em.fan_n == 3
    assert [s.seed for s in chat_emulation.sub_requests(em, asked)] == [5, 6, 7]


def test_a_guided_retry_asks_with_the_seed_moved_on_past_the_calls_beside_it() -> None:
    guide = make_guide(ADAPTER.params, req(guided_choice=["yes", "no"]), "p", CAPS)
    assert guide is not None
    seeds: list[Any] = []

    async def call(sub: CompletionRequest) -> Completion:
        seeds.append(sub.seed)
        return answer("yes" if len(seeds) == 3 else "maybe")  # the third call answers well

    async def run(seed: int | None) -> Completion:
        return await checked(guide, 2, req(seed=seed), call, call, Work(10_000), _texts, 4)

    got = asyncio.run(run(10))
    assert got.choices[0].text == "yes" and seeds == [10, 14, 18]
    seeds.clear()
    asyncio.run(run(None))
    assert seeds == [None, None, None]
    seeds.clear()

    async def never(sub: CompletionRequest) -> Completion:
        seeds.append(sub.seed)
        return answer("maybe")

    try:
        asyncio.run(checked(guide, 1, req(seed=0), never, never, Work(10_000), _texts, 1))
    except UpstreamError as exc:
        assert exc.code == "guided_output_invalid"
    else:
        raise AssertionError("an answer that never matches is a 502")
    assert seeds == [0, 1]


def _texts(c: Completion) -> list[str]:
    return [ch.text for ch in c.choices]
