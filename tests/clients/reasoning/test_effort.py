"""`reasoning_effort` (and `verbosity`): under OpenAI's name to the kinds whose chat route takes it, as
Anthropic's `output_config.effort`, as Gemini's `thinkingConfig`, refused by name elsewhere (and on OpenAI's
completions); each effort its own cache entry."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.clients.reasoning.upstreams import MESSAGES
from tests.helpers.upstreams import Received


@pytest.mark.parametrize(
    ("model", "effort"), [("oa/o4-mini", "high"), ("oa/gpt-5", "minimal"), ("hosted/gpt-oss", "low")]
)
def test_reasoning_effort_reaches_the_kinds_that_take_it(
    client: openai.OpenAI, received: list[Received], model: str, effort: Any
) -> None:
    answer = client.chat.completions.create(model=model, messages=MESSAGES, reasoning_effort=effort, max_tokens=64)
    assert answer.choices[0].message.content
    (sent,) = received
    assert sent.json()["reasoning_effort"] == effort


def test_verbosity_reaches_openai_and_is_refused_elsewhere(
    client: openai.OpenAI, api: httpx.Client, received: list[Received]
) -> None:
    client.chat.completions.create(model="oa/gpt-5", messages=MESSAGES, verbosity="low")
    assert received[0].json()["verbosity"] == "low"
    r = api.post("/v1/chat/completions", json={"model": "hosted/x", "messages": MESSAGES, "verbosity": "low"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "verbosity", r.text
    assert len(received) == 1


def test_reasoning_effort_refused_by_name_where_it_has_no_place(api: httpx.Client, received: list[Received]) -> None:
    for path, body in (
        ("/v1/chat/completions", {"model": "mis/magistral-medium-latest", "messages": MESSAGES}),
        ("/v1/completions", {"model": "oa/gpt-3.5-turbo-instruct", "prompt": "hi"}),
    ):
        r = api.post(path, json={**body, "reasoning_effort": "low"})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "reasoning_effort" and error["code"] == "unsupported_parameter", error
    bad = api.post("/v1/chat/completions", json={"model": "oa/o4-mini", "messages": MESSAGES, "reasoning_effort": 3})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort", bad.text
    assert received == []


def test_reasoning_effort_is_anthropics_effort(
    client: openai.OpenAI, api: httpx.Client, received: list[Received]
) -> None:
    """Anthropic names the same levels `output_config.effort`; OpenAI's `none` and `minimal` have none there."""
    client.chat.completions.create(model="claude/claude-opus-4-5", messages=MESSAGES, reasoning_effort="medium")
    client.completions.create(model="claude/claude-opus-4-5", prompt="hi", extra_body={"reasoning_effort": "high"})
    assert [r.json()["output_config"] for r in received] == [{"effort": "medium"}, {"effort": "high"}]
    assert all("reasoning_effort" not in r.json() for r in received)
    for effort in ("none", "minimal"):
        body = {"model": "claude/claude-opus-4-5", "messages": MESSAGES, "reasoning_effort": effort}
        r = api.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"]) == ("reasoning_effort", "unsupported_parameter"), error
        assert effort in error["message"]
    assert len(received) == 2


def test_anthropics_effort_sits_beside_what_extras_put_in_output_config(
    client: openai.OpenAI, api: httpx.Client, received: list[Received]
) -> None:
    """The extras extend `output_config` rather than replace it; both setting the effort is a 400."""
    fmt = {"type": "json_schema", "schema": {"type": "object"}}
    client.chat.completions.create(
        model="claude/claude-opus-4-5",
        messages=MESSAGES,
        reasoning_effort="low",
        extra_body={"inference_extra_params": {"output_config": {"format": fmt}}},
    )
    assert received[0].json()["output_config"] == {"effort": "low", "format": fmt}
    both = {
        "model": "claude/claude-opus-4-5",
        "messages": MESSAGES,
        "reasoning_effort": "low",
        "inference_extra_params": {"output_config": {"effort": "max"}},
    }
    r = api.post("/v1/chat/completions", json=both)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("reasoning_effort", "invalid_value")
    alone = {k: v for k, v in both.items() if k != "reasoning_effort"}
    assert api.post("/v1/chat/completions", json=alone).status_code == 200
    assert [r.json()["output_config"] for r in received] == [{"effort": "low", "format": fmt}, {"effort": "max"}]


@pytest.mark.parametrize(
    ("model", "effort", "config"),
    [
        ("gem/gemini-2.5-pro", "high", {"thinkingBudget": 24576}),
        ("gem/gemini-3-pro-preview", "low", {"thinkingLevel": "low"}),
    ],
)
def test_reasoning_effort_reaches_gemini_as_its_thinking_config(
    client: openai.OpenAI, received: list[Received], model: str, effort: Any, config: dict[str, Any]
) -> None:
    answer = client.chat.completions.create(model=model, messages=MESSAGES, reasoning_effort=effort)
    assert answer.choices[0].message.content
    (sent,) = received
    assert sent.json()["generationConfig"] == {"thinkingConfig": config}
    assert "reasoning_effort" not in sent.json()


def test_gemini_refuses_an_effort_google_documents_no_mapping_for(api: httpx.Client, received: list[Received]) -> None:
    body = {"model": "gem/gemini-2.5-pro", "messages": MESSAGES, "reasoning_effort": "none"}
    r = api.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": {
            "message": "Provider 'gem' cannot take reasoning_effort 'none' for model 'gemini-2.5-pro': Gemini 2.5 "
            "Pro cannot turn thinking off (Google's mapping: ai.google.dev/gemini-api/docs/openai#thinking)",
            "type": "invalid_request_error",
            "param": "reasoning_effort",
            "code": "unsupported_parameter",
        }
    }
    assert received == []


def test_each_effort_is_its_own_cache_entry(client: openai.OpenAI, received: list[Received]) -> None:
    for effort in ("low", "high", "low", "high"):
        client.chat.completions.create(model="cached", messages=MESSAGES, reasoning_effort=effort)
    assert [r.json()["reasoning_effort"] for r in received] == ["low", "high"]
