"""A model's thinking comes back as `reasoning_content`, plain and streamed, from Anthropic's thinking
blocks, Magistral's thinking chunks and Gemini's thought summaries; a stream gives each of Anthropic's
signed blocks whole, and the cache's replay gives it again."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from tests.clients.reasoning.upstreams import MESSAGES, QUESTION, THINKING
from tests.helpers.recordings import fixture_json
from tests.helpers.upstreams import Received


def test_anthropic_thinking_as_reasoning_content(client: openai.OpenAI, received: list[Received]) -> None:
    thinking = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    recorded = fixture_json("anthropic/messages_thinking.json")["content"]
    answer = client.chat.completions.create(
        model="claude/claude-sonnet-4-5",
        messages=MESSAGES,
        max_tokens=4096,
        extra_body={"inference_extra_params": thinking},
    )
    message = answer.choices[0].message
    assert message.content == recorded[1]["text"]
    assert message.model_extra is not None and message.model_extra["reasoning_content"] == recorded[0]["thinking"]
    assert received[0].json()["thinking"] == thinking["thinking"]
    stream = client.chat.completions.create(
        model="claude/claude-sonnet-4-5",
        messages=MESSAGES,
        max_tokens=4096,
        stream=True,
        extra_body={"inference_extra_params": thinking},
    )
    reasoning, content = "", ""
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            content += delta.content or ""
    assert reasoning.startswith("This is a straightforward question about pedestrian safety.")
    assert content.startswith("Here are the basic steps for safely crossing the street")


def test_mistral_thinking_chunks_as_reasoning_content(client: openai.OpenAI) -> None:
    # Magistral's content is chunks, not a string: the answer still decodes, thinking apart from text.
    answer = client.chat.completions.create(model="mis/magistral-medium-latest", messages=MESSAGES)
    message = answer.choices[0].message
    assert message.content is not None and message.content.startswith("Crossing a river is quite different")
    assert (message.model_extra or {})["reasoning_content"].startswith("**Analogizing crossing a river**")
    stream = client.chat.completions.create(model="mis/magistral-medium-latest", messages=MESSAGES, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning.startswith("Okay, the user is asking how to cross the street.")
    assert "".join(d.content or "" for d in deltas).startswith("To cross the street safely")


def test_gemini_thought_summaries_as_reasoning_content(api: httpx.Client, received: list[Received]) -> None:
    extra = {"generationConfig": {"thinkingConfig": {"includeThoughts": True}}}
    body = {"model": "gem/gemini-2.5-pro", "messages": MESSAGES, "inference_extra_params": extra}
    with api.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        lines = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines if line != "[DONE]"]
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks if c["choices"])
    assert reasoning.startswith("**Clarifying User Goals**")
    assert received[0].json()["generationConfig"]["thinkingConfig"] == {"includeThoughts": True}


def test_a_stream_gives_each_signed_block_whole_and_a_replay_gives_it_again(
    client: openai.OpenAI, received: list[Received]
) -> None:
    def streamed() -> tuple[str, list[Any]]:
        reasoning = ""
        blocks: list[Any] = []
        stream = client.chat.completions.create(
            model="cached-claude",
            messages=QUESTION,
            max_tokens=4096,
            stream=True,
            extra_body={"inference_extra_params": THINKING},
        )
        for chunk in stream:
            extra = chunk.choices[0].delta.model_extra or {} if chunk.choices else {}
            reasoning += extra.get("reasoning_content") or ""
            blocks += extra.get("thinking_blocks") or []
        return reasoning, blocks

    reasoning, blocks = streamed()
    assert len(blocks) == 1 and blocks[0]["type"] == "thinking" and blocks[0]["thinking"] == reasoning
    assert blocks[0]["signature"].startswith("EvMCCkYICxgC") and reasoning.startswith("This is a straightforward")
    assert streamed() == (reasoning, blocks)  # the cache's replay of the stored answer
    assert len(received) == 1
