"""Fireworks `/inference/v1/completions` (seed 001): OpenAI's fields plus top_k, response_format with a
schema, context_length_exceeded_behavior and images; best_of and suffix are not documented, so refused.

No recorded Fireworks *completions* response exists (fixtures/INDEX.md); the one Fireworks recording is a
chat-completions stream, used below only for SSE framing and its usage-on-the-last-chunk semantics.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.upstream.framing import SSEDecoder
from providers.base import Endpoint, map_params
from providers.fireworks import FireworksAdapter
from tests.helpers.adapters import build, chunked, context, request
from tests.helpers.recordings import fixture_bytes
from wire.errors import UnsupportedParamError
from wire.schema import Usage

ADAPTER = FireworksAdapter()
MODEL = "accounts/fireworks/models/llama-v3p1-8b-instruct"
ENDPOINT = Endpoint(provider="fireworks", model=MODEL, base_url=FireworksAdapter.default_base_url or "", api_key="fw")
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def test_extensions_pass_natively() -> None:
    image = "data:image/jpeg;base64,/9j/4AAQSkZJRg=="
    req = request(
        f"fireworks/{MODEL}",
        "<image> What is in the picture?",
        max_tokens=64,
        temperature=0.2,
        top_k=40,
        logprobs=2,
        echo=False,
        response_format={"type": "json_object", "schema": SCHEMA},
        context_length_exceeded_behavior="error",
        images=[image],
        user="u-1",
    )
    up, body, _ = build(ADAPTER, req, ENDPOINT)
    assert up.url == "https://api.fireworks.ai/inference/v1/completions"
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "authorization": "Bearer fw",
    }
    assert body == {
        "model": MODEL,
        "prompt": "<image> What is in the picture?",
        "max_tokens": 64,
        "temperature": 0.2,
        "top_k": 40,
        "logprobs": 2,
        "echo": False,
        "response_format": {"type": "json_object", "schema": SCHEMA},
        "images": [image],
        "context_length_exceeded_behavior": "error",
        "user": "u-1",
    }


@pytest.mark.parametrize("field,value", [("best_of", 2), ("suffix", "tail")])
def test_undocumented_fields_are_refused(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'fireworks'"


def test_drop_policy_lists_what_was_dropped() -> None:
    req = request(best_of=2, suffix="tail", seed=1, max_tokens=3)
    params, dropped = map_params(req, ADAPTER.params, "fireworks", drop_unsupported=True)
    assert dropped == ["best_of", "suffix"]
    assert params == {"max_tokens": 3, "seed": 1}


def test_logprobs_capped_at_five() -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(logprobs=True, top_logprobs=8), ENDPOINT)
    assert info.value.param == "logprobs"


def test_stream_request_asks_for_usage() -> None:
    up, body, _ = build(ADAPTER, request(stream=True, max_tokens=2), ENDPOINT)
    assert up.stream is True
    assert body == {
        "model": MODEL,
        "prompt": "Say this is a test",
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_chat_stream_recording_framing_and_usage_on_the_finish_chunk() -> None:
    """CHAT recording (HF router -> Fireworks): the completions parser sees no `text` in chat deltas, so only
    the framing, `usage: null` on every chunk but the finish chunk, and the finish reason are checked."""
    raw = fixture_bytes("fireworks/chat_stream_via_hf_router.sse.txt")
    decoder = SSEDecoder()
    events = [e for part in chunked(raw, 11) for e in decoder.feed(part)] + decoder.close()
    assert len(events) == 7
    assert events[-1] == (None, b"[DONE]")
    parsed = [ADAPTER.parse_event(name, data, context()) for name, data in events]
    assert parsed[-1] is None
    chunks = [c for c in parsed if c is not None]
    assert [c.usage for c in chunks] == [None] * 5 + [Usage(prompt_tokens=46, completion_tokens=20, total_tokens=66)]
    assert [c.choices[0].finish_reason for c in chunks] == [None] * 5 + ["length"]
    assert {c.created for c in chunks} == {1739457447}
