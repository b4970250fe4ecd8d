"""Chat on Bedrock's Converse, the answers: the recorded answers (text, tool use, structured output, a cache
read) as chat shapes (tests/fixtures/SOURCES.md), and errors in a 200 or an answer without output."""

from __future__ import annotations

import json

import msgspec
import pytest

from providers.envelope import Unreadable
from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.providers.bedrock_setup import ADAPTER, chat_ctx
from wire.errors import UpstreamStatusError


def test_recorded_tool_use_answer() -> None:
    recorded = fixture_json("bedrock/converse_tool_use.json")
    answer = ADAPTER.parse_chat_response(fixture_bytes("bedrock/converse_tool_use.json"), chat_ctx())
    (choice,) = answer.choices
    use = recorded["output"]["message"]["content"][0]["toolUse"]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    written = [msgspec.to_builtins(c) for c in calls]
    assert [(c["id"], c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in written] == [
        (use["toolUseId"], "function", use["name"], use["input"])
    ]
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (571, 22)


@pytest.mark.parametrize(
    ("name", "finish"),
    [("converse_end_turn.json", "stop"), ("converse_max_tokens.json", "length"), ("converse_json_schema.json", "stop")],
)
def test_recorded_text_answers(name: str, finish: str) -> None:
    recorded = fixture_json(f"bedrock/{name}")
    answer = ADAPTER.parse_chat_response(fixture_bytes(f"bedrock/{name}"), chat_ctx())
    (choice,) = answer.choices
    assert choice.message.content == recorded["output"]["message"]["content"][0]["text"]
    assert choice.message.tool_calls is None and choice.finish_reason == finish
    assert answer.id == "chatcmpl-b" and answer.model == "aws/x"


def test_recorded_cache_read_usage() -> None:
    answer = ADAPTER.parse_chat_response(fixture_bytes("bedrock/converse_cache_read.json"), chat_ctx())
    assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    assert answer.usage.prompt_tokens_details.cached_tokens == 1504


def test_errors_in_a_200_and_answers_without_output() -> None:
    with pytest.raises(UpstreamStatusError) as caught:
        ADAPTER.parse_chat_response(b'{"__type":"ThrottlingException","message":"Too many"}', chat_ctx())
    assert caught.value.upstream_status == 429
    with pytest.raises(Unreadable):
        ADAPTER.parse_chat_response(b'{"stopReason":"end_turn"}', chat_ctx())
