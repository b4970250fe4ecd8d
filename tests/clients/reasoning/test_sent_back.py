"""A model's thinking goes back in the next turn as the agent loop sends it (the answer's message object
appended): `reasoning_content` to DeepSeek and Fireworks, as `reasoning` to vLLM and Ollama, as a `thinking`
content chunk to Mistral, Anthropic's signed `thinking_blocks` at the head of their turn, neither to a
strict server; what is sent back is checked like every other field."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.clients.reasoning.upstreams import QUESTION, THINKING, TOOL_THINKER, TOOLS
from tests.helpers.recordings import fixture_json
from tests.helpers.upstreams import Received


def _loop(client: openai.OpenAI, model: str) -> None:
    """Two turns of the agent loop: the answer's message object appended as it came, then the tool's result."""
    answer = client.chat.completions.create(model=model, messages=QUESTION, tools=TOOLS)
    message = answer.choices[0].message
    assert message.tool_calls and (message.model_extra or {}).get("reasoning_content")
    call = message.tool_calls[0]
    client.chat.completions.create(
        model=model,
        messages=[*QUESTION, message, {"role": "tool", "tool_call_id": call.id, "content": "{}"}],  # type: ignore[list-item]
        tools=TOOLS,
    )


def test_deepseek_gets_the_reasoning_of_a_turn_that_called_tools_back(
    client: openai.OpenAI, received: list[Received]
) -> None:
    recorded = fixture_json("deepseek/chat_thinking_tool_calls.json")["choices"][0]["message"]
    _loop(client, "ds/deepseek-reasoner")
    sent = received[1].json()["messages"][1]
    # As pydantic-ai's recorded second request sends it: the turn whole, its reasoning_content included.
    assert sent == {
        "role": "assistant",
        "content": recorded["content"],
        "reasoning_content": recorded["reasoning_content"],
        "tool_calls": [{"id": c["id"], "type": "function", "function": c["function"]} for c in recorded["tool_calls"]],
    }


def test_fireworks_gets_it_as_reasoning_content(client: openai.OpenAI, received: list[Received]) -> None:
    recorded = fixture_json("deepseek/chat_thinking_tool_calls.json")["choices"][0]["message"]
    _loop(client, f"fw/{TOOL_THINKER}")
    assert received[1].path == "/fw/v1/chat/completions"
    turn = received[1].json()["messages"][1]
    assert turn["reasoning_content"] == recorded["reasoning_content"] and "reasoning" not in turn


def test_mistral_gets_it_as_a_thinking_chunk_at_the_head_of_the_turn(
    client: openai.OpenAI, received: list[Received]
) -> None:
    # The two turns of pydantic-ai's recording: Mistral answered its second request, whose assistant turn carries
    # the first answer's thinking as a `thinking` chunk of text chunks before a `text` chunk.
    recorded = fixture_json("mistral/chat_magistral_thinking_request.json")["messages"]
    model = "mis/magistral-medium-latest"
    message = client.chat.completions.create(model=model, messages=recorded[:1]).choices[0].message
    reasoning = (message.model_extra or {})["reasoning_content"]
    client.chat.completions.create(model=model, messages=[recorded[0], message, recorded[2]])  # type: ignore[list-item]
    assert received[1].path == "/mistral/v1/chat/completions"
    sent = received[1].json()["messages"]
    assert sent[0] == recorded[0] and sent[2] == recorded[2]
    assert sent[1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": [{"type": "text", "text": reasoning}]},
            {"type": "text", "text": message.content},
        ],
    }

    def shape(chunk: dict[str, Any]) -> tuple[object, ...]:
        return chunk["type"], sorted(chunk), {tuple(sorted(t)) for t in chunk.get("thinking", ())}

    assert [shape(c) for c in sent[1]["content"]] == [shape(c) for c in recorded[1]["content"]]


@pytest.mark.parametrize("provider", ["hosted", "local"])
def test_vllm_and_ollama_get_it_as_reasoning_and_a_strict_server_not_at_all(
    client: openai.OpenAI, received: list[Received], provider: str
) -> None:
    recorded = fixture_json("deepseek/chat_thinking_tool_calls.json")["choices"][0]["message"]
    _loop(client, f"{provider}/{TOOL_THINKER}")
    turn = received[1].json()["messages"][1]
    assert received[1].path == "/v1/chat/completions"
    assert turn["reasoning"] == recorded["reasoning_content"] and "reasoning_content" not in turn
    received.clear()
    _loop(client, f"oa/{TOOL_THINKER}")
    turn = received[1].json()["messages"][1]
    assert turn["role"] == "assistant" and turn["tool_calls"]
    assert "reasoning_content" not in turn and "reasoning" not in turn and "thinking_blocks" not in turn


def test_anthropics_signed_thinking_comes_back_first_in_its_turn(
    client: openai.OpenAI, received: list[Received]
) -> None:
    recorded = fixture_json("anthropic/messages_thinking.json")["content"]
    answer = client.chat.completions.create(
        model="claude/claude-sonnet-4-5",
        messages=QUESTION,
        max_tokens=4096,
        extra_body={"inference_extra_params": THINKING},
    )
    message = answer.choices[0].message
    assert (message.model_extra or {})["thinking_blocks"] == [recorded[0]]
    client.chat.completions.create(
        model="claude/claude-sonnet-4-5",
        messages=[*QUESTION, message, {"role": "user", "content": "And 5?"}],  # type: ignore[list-item]
        max_tokens=4096,
        extra_body={"inference_extra_params": THINKING},
    )
    turn = received[1].json()["messages"][1]
    assert turn == {"role": "assistant", "content": [recorded[0], {"type": "text", "text": recorded[1]["text"]}]}


def test_thinking_blocks_are_checked_like_every_other_field(api: httpx.Client, received: list[Received]) -> None:
    for bad, param in (
        ({"type": "thinking", "signature": "s"}, "messages.thinking_blocks.thinking"),
        ({"type": "summary", "text": "x"}, "messages.thinking_blocks.type"),
        ({"type": "redacted_thinking", "data": 3}, "messages.thinking_blocks.data"),
    ):
        turn = {"role": "assistant", "content": "4", "thinking_blocks": [bad]}
        body = {"model": "claude/claude-sonnet-4-5", "messages": [*QUESTION, turn, *QUESTION]}
        r = api.post("/v1/chat/completions", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.json()
    reasoning = {"role": "assistant", "content": "4", "reasoning_content": ["not", "text"]}
    r = api.post("/v1/chat/completions", json={"model": "ds/x", "messages": [*QUESTION, reasoning, *QUESTION]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.reasoning_content", r.text
    assert received == []
