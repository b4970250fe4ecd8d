"""A chat template's variables (Qwen3's thinking switch) reach the servers that render one and are refused
by name elsewhere; a chat template itself is refused from every client, on chat and on completions."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.clients.reasoning.upstreams import MESSAGES
from tests.helpers.upstreams import Received


def test_a_chat_templates_variables_reach_the_servers_that_render_one(
    client: openai.OpenAI, api: httpx.Client, received: list[Received]
) -> None:
    # Qwen3's switch, as vLLM's and llama-server's docs send it; each value its own cache entry.
    for value in (False, True, False):
        extra = {"chat_template_kwargs": {"enable_thinking": value}}
        client.chat.completions.create(model="cached", messages=MESSAGES, extra_body=extra)
    assert [r.json()["chat_template_kwargs"] for r in received] == [
        {"enable_thinking": False},
        {"enable_thinking": True},
    ]
    received.clear()
    for model in ("local/qwen3", "oa/gpt-4o-mini"):  # Ollama and OpenAI render no template of the client's
        r = api.post(
            "/v1/chat/completions",
            json={"model": model, "messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}},
        )
        assert r.status_code == 400, r.text
        assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (
            "chat_template_kwargs",
            "unsupported_parameter",
        )
    assert received == []


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("chat_template_kwargs", {"chat_template": "{{ x }}"}, "chat_template_kwargs.chat_template"),
        ("inference_extra_params", {"chat_template": "{{ x }}"}, "inference_extra_params"),
        ("inference_extra_params", {"template": '{{ printf "%0999999999d" 0 }}'}, "inference_extra_params"),
        (
            "inference_extra_params",
            {"chat_template_kwargs": {"enable_thinking": False, "chat_template": "{{ x }}"}},
            "inference_extra_params.chat_template_kwargs.chat_template",
        ),
    ],
)
def test_no_client_sends_a_chat_template(
    api: httpx.Client, received: list[Received], field: str, value: Any, param: str
) -> None:
    # A Jinja template from a request can keep a shared server's CPU busy as long as it likes (CVE-2025-61620):
    # neither as the field nor inside the template's variables, on chat or on completions.
    for path, body in (
        ("/v1/chat/completions", {"model": "hosted/qwen3", "messages": MESSAGES}),
        ("/v1/completions", {"model": "hosted/qwen3", "prompt": "hi"}),
    ):
        r = api.post(path, json={**body, field: value})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["type"]) == (param, "invalid_request_error"), error
        assert "template" in error["message"]
    assert received == []
