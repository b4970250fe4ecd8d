"""What a chat request may not say: each is a 400 naming the field (a 422 in FastAPI's shape on the sgp and
pais routes), sent nowhere; a provider kind without a chat route is a 400 naming the provider."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.clients.chat.upstreams import CALL, MESSAGES, TOOLS
from tests.helpers.upstreams import Received


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": "oa/m", "messages": MESSAGES, "prompt": "x"}, "prompt", "unknown_parameter"),
        ({"model": "oa/m", "messages": MESSAGES, "suffix": "x"}, "suffix", "unknown_parameter"),
        ({"model": "oa/m", "messages": MESSAGES, "echo": "yes"}, "echo", "invalid_value"),
        # Completion-only fields under the names chat's request holds them by (a leading space): unknown all the same.
        *(
            ({"model": "oa/m", "messages": MESSAGES, f" {name}": value}, f" {name}", "unknown_parameter")
            for name, value in (
                ("best_of", 2),
                ("echo", True),
                ("suffix", "x"),
                ("max_new_tokens", 3),
                ("stop_sequences", ["a"]),
                ("return_token_log_probs", True),
                ("images", ["aGk="]),
                ("context_length_exceeded_behavior", "truncate"),
            )
        ),
        ({"model": "oa/m", "messages": MESSAGES, "temprature": 1}, "temprature", "unknown_parameter"),
        ({"model": "oa/m"}, "messages", "missing_required_parameter"),
        ({"model": "oa/m", "messages": []}, "messages", "invalid_value"),
        ({"model": "oa/m", "messages": [{"role": "robot", "content": "x"}]}, "messages.role", "invalid_value"),
        (
            {"model": "oa/m", "messages": [{"role": "tool", "content": "x"}]},
            "messages.tool_call_id",
            "missing_required_parameter",
        ),
        ({"model": "oa/m", "messages": MESSAGES, "logprobs": 3}, "logprobs", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "temperature": 9}, "temperature", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "tool_choice": "auto"}, "tool_choice", "invalid_value"),
        (
            {"model": "oa/m", "messages": MESSAGES, "tools": [{"type": "function"}]},
            "tools.function",
            "missing_required_parameter",
        ),
        (
            {"model": "oa/m", "messages": MESSAGES, "response_format": {"type": "yaml"}},
            "response_format.type",
            "invalid_value",
        ),
        ({"model": "oa/m", "messages": MESSAGES, "top_k": 5}, "top_k", "unsupported_parameter"),
        (
            {"model": "oa/m", "messages": MESSAGES, "max_tokens": 5, "max_completion_tokens": 6},
            "max_completion_tokens",
            None,
        ),
        ({"model": "oa/m", "messages": MESSAGES, "n": 0}, "n", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "top_p": 2}, "top_p", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "seed": "x"}, "seed", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "stop": 5}, "stop", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "frequency_penalty": 3}, "frequency_penalty", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "presence_penalty": -3}, "presence_penalty", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "logit_bias": {"50256": 200}}, "logit_bias", None),
        ({"model": "oa/m", "messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", None),
        ({"model": "oa/m", "messages": MESSAGES, "user": 5}, "user", "invalid_value"),
        ({"model": "oa/m", "messages": MESSAGES, "stream_options": {"include_usage": True}}, "stream_options", None),
        ({"model": "oa/m", "messages": MESSAGES, "stream": True, "stream_options": {"x": 1}}, "stream_options.x", None),
        ({"model": "oa/m", "messages": MESSAGES, "parallel_tool_calls": "yes"}, "parallel_tool_calls", None),
        (
            {"model": "oa/m", "messages": [{"role": "user", "content": [{"type": "input_audio", "x": 1}]}]},
            "messages.content.type",
            None,
        ),
        ({"model": "oa/m", "messages": [{"role": "user", "content": "x", "colour": 1}]}, "messages.colour", None),
        ({"model": "oa/m", "messages": [{"role": "user", "content": "x", "type": "image"}]}, "messages.type", None),
        # What the openai SDK sends back of its own message objects is taken null; an audio reply or a legacy
        # function call is not.
        ({"model": "oa/m", "messages": [{"role": "assistant", "audio": {"id": "a1"}}]}, "messages.audio", None),
        (
            {"model": "oa/m", "messages": [{"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}]},
            "messages.function_call",
            None,
        ),
        (
            {"model": "oa/m", "messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "custom"}]}]},
            "messages.tool_calls.type",
            None,
        ),
        (
            {"model": "oa/m", "messages": [{"role": "assistant", "tool_calls": [{"id": "a", "type": "function"}]}]},
            "messages.tool_calls.function",
            None,
        ),
        ({"model": "oa/m", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", None),
        (
            {"model": "oa/m", "messages": MESSAGES, "response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            None,
        ),
        # Names end where their characters do: a final newline is not one of them.
        ({"model": "oa/m", "messages": [{"role": "user", "content": "x", "name": "bob\n"}]}, "messages.name", None),
        (
            {"model": "oa/m", "messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f\n"}}]},
            "tools.function.name",
            None,
        ),
        (
            {
                "model": "oa/m",
                "messages": MESSAGES,
                "response_format": {"type": "json_schema", "json_schema": {"name": "s\n"}},
            },
            "response_format.json_schema.name",
            None,
        ),
        # The in-process provider's bound on the work a request may make the gateway's loop do.
        ({"model": "demo/echo", "messages": MESSAGES, "max_tokens": 10**9}, "max_tokens", "invalid_value"),
    ],
)
def test_bad_requests_name_the_field(
    api: httpx.Client, received: list[Received], body: dict[str, Any], param: str, code: str | None
) -> None:
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    assert received == []


@pytest.mark.parametrize("model", ["oa/gpt-3.5-turbo", "claude/claude-3-5-sonnet-latest", "demo/echo"])
@pytest.mark.parametrize(
    ("messages", "at", "param"),
    [
        (
            [*MESSAGES, {"role": "assistant", "tool_calls": [{"id": "", "type": "function", "function": CALL}]}],
            "messages[1].tool_calls[0].id",
            "messages.tool_calls.id",
        ),
        (
            [
                *MESSAGES,
                {"role": "assistant", "tool_calls": [{"id": "call_1", "function": CALL}, {"id": "", "function": CALL}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "57F"},
            ],
            "messages[1].tool_calls[1].id",
            "messages.tool_calls.id",
        ),
        (
            [
                *MESSAGES,
                {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": CALL}]},
                {"role": "tool", "tool_call_id": "", "content": "57F"},
            ],
            "messages[2].tool_call_id",
            "messages.tool_call_id",
        ),
    ],
)
def test_an_empty_tool_call_id_is_a_400_naming_the_field(
    api: httpx.Client, received: list[Received], model: str, messages: list[Any], at: str, param: str
) -> None:
    # A tool message names the call it answers by its id: an empty one names no call, whichever kind serves it.
    resp = api.post("/v1/chat/completions", json={"model": model, "messages": messages, "tools": TOOLS})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error == {
        "message": f"Invalid value for '{at}': Expected `str` of length >= 1",
        "type": "invalid_request_error",
        "param": param,
        "code": "invalid_value",
    }
    assert received == []


def test_kind_without_chat_is_a_400_naming_the_provider(api: httpx.Client, received: list[Received]) -> None:
    resp = api.post("/v1/chat/completions", json={"model": "legacy/served", "messages": MESSAGES})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "unsupported_endpoint" and "'legacy'" in error["message"]
    assert received == []


@pytest.mark.parametrize("path", ["/v4/beta/chat/completions", "/api/v1/compatibility/openai/v1/chat/completions"])
def test_sgp_and_pais_routes_speak_fastapi(api: httpx.Client, received: list[Received], path: str) -> None:
    resp = api.post(path, json={"model": "oa/m", "messages": []})
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["body", "messages"]
    # A field of sgp-python's chat request the gateway does not take is refused by name, in the same shape.
    resp = api.post(path, json={"model": "oa/m", "messages": MESSAGES, "memory_strategy": {"name": "last_k"}})
    assert resp.status_code == 422
    refused = [(d["loc"], d["type"]) for d in resp.json()["detail"]]
    assert refused == [(["body", "memory_strategy"], "unknown_parameter")]
    assert received == []
