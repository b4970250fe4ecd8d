"""Planning what the gateway emulates for a provider, and refusing what it cannot (gateway/emulation/planning.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway import emulation
from providers.base import Table, table
from tests.unit.emulation_setup import ADAPTER, OnePrompt, req
from wire.errors import InvalidRequestError

# -- planning ------------------------------------------------------------------------------------


def test_nothing_to_emulate_is_none() -> None:
    assert emulation.plan(ADAPTER, req(max_tokens=3), "p", 2) is None


def test_plan_fans_out_prompts_and_n() -> None:
    em = emulation.plan(ADAPTER, req(prompt=["a", "b"], n=3), "p", 2)
    assert em is not None
    assert (em.prompts, em.fan_n, em.n) == (["a", "b"], 3, 3)
    subs = emulation.sub_requests(em, req(prompt=["a", "b"], n=3))
    assert [(s.prompt, s.n) for s in subs] == [("a", None)] * 3 + [("b", None)] * 3


def test_plan_enforces_stops_beyond_the_providers_count() -> None:
    em = emulation.plan(ADAPTER, req(stop=["a", "b", "c"]), "p", 2)
    assert em is not None
    assert (em.stops, em.upstream_stop) == (["a", "b", "c"], ["a", "b"])


def test_plan_keeps_stop_strings_itself_when_the_provider_would_strip_them() -> None:
    em = emulation.plan(ADAPTER, req(stop=["END"], include_stop_str_in_output=True), "p", 2)
    assert em is not None
    assert (em.stops, em.upstream_stop, em.include_stop) == (["END"], None, True)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"echo": True, "logprobs": 1}, "echo"),
        ({"guided_grammar": "root ::= 'a'"}, "guided_grammar"),
        ({"guided_regex": "("}, "guided_regex"),
    ],
)
def test_plan_refuses_what_cannot_be_emulated(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        emulation.plan(ADAPTER, req(**fields), "p", 2)
    assert err.value.param == param


def test_best_of_needs_logprobs_to_rank() -> None:
    class NoLogprobs(OnePrompt):
        params: Table = table(OnePrompt.params, drop=("logprobs",))

    with pytest.raises(InvalidRequestError) as err:
        emulation.plan(NoLogprobs(), req(best_of=3), "p", 2)
    assert (err.value.param, err.value.message) == (
        "best_of",
        "'best_of' cannot be emulated for provider 'p': it returns no logprobs",
    )
