"""Chat on Gemini's generateContent (providers/gemini_chat.py): the conversation as `contents` and
`systemInstruction`, tools as function declarations, and the recorded answers and streams (text, whole
`functionCall` parts with their thought signatures) as chat shapes."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from gateway.path.chat_request import normalize_chat
from gateway.upstream.framing import DECODERS
from providers.base import CallContext, Endpoint, map_params
from providers.gemini import GeminiAdapter
from providers.gemini_chat import SIGNATURE
from tests.helpers.recordings import fixture_bytes, fixture_json
from wire.chat import ChatChunk, ChatRequest, decode_chat
from wire.errors import InvalidRequestError, UnsupportedParamError, UpstreamStatusError

ENDPOINT = Endpoint(provider="gem", model="gemini-2.0-flash", base_url="https://generativelanguage.googleapis.com")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "final_result",
            "description": "The final response",
            "parameters": {"type": "object", "properties": {"response": {"type": "array"}}},
        },
    },
    {"type": "function", "function": {"name": "generate_topic"}},
]


def _ctx(n: int = 1) -> CallContext:
    return CallContext(id="chatcmpl-g1", created=1, model="gem/x", chat=True, n=n)


def _req(**body: Any) -> ChatRequest:
    req = decode_chat(msgspec.json.encode({"model": "gem/x", **body}))
    normalize_chat(req)
    return req


def _sent(req: ChatRequest) -> tuple[str, dict[str, Any]]:
    adapter = GeminiAdapter()
    assert adapter.chat_params is not None
    params, _ = map_params(req, adapter.chat_params, "gem", False)
    up = adapter.build_chat_request(req, ENDPOINT, params)
    body: dict[str, Any] = json.loads(up.body)
    return up.url, body


def _stream(raw: bytes, ctx: CallContext) -> list[ChatChunk]:
    decoder = DECODERS["sse"](max_event_bytes=1 << 20)
    adapter = GeminiAdapter()
    chunks = []
    for event, data in [*decoder.feed(raw), *decoder.close()]:
        chunk = adapter.parse_chat_event(event, data, ctx)
        if chunk is not None:
            chunks.append(chunk)
    return chunks


def test_the_conversation_as_contents() -> None:
    function = {"name": "lookup", "arguments": '{"q":"x"}'}
    call = {"id": "c1" + SIGNATURE + "c2ln", "type": "function", "function": function}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA="}}
    url, body = _sent(
        _req(
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                {"role": "user", "content": [image]},
                {"role": "assistant", "content": "Looking.", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "found"},
                {"role": "user", "content": "Thanks"},
            ],
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "final_result"}},
            max_tokens=40,
            stop=["END"],
            temperature=0.5,
            seed=7,
            response_format={"type": "json_object"},
        )
    )
    assert url.endswith("/v1beta/models/gemini-2.0-flash:generateContent")
    assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}, {"text": "Use tools."}]}
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "Hi"}, {"inlineData": {"mimeType": "image/png", "data": "AAA="}}]},
        {
            "role": "model",
            "parts": [
                {"text": "Looking."},
                # The id's signature goes back as the part's thoughtSignature, the id without it.
                {"functionCall": {"name": "lookup", "args": {"q": "x"}, "id": "c1"}, "thoughtSignature": "c2ln"},
            ],
        },
        # A tool result and the next user message: one user turn.
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "lookup", "id": "c1", "response": {"content": "found"}}},
                {"text": "Thanks"},
            ],
        },
    ]
    assert body["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "final_result",
                    "description": "The final response",
                    "parametersJsonSchema": {"type": "object", "properties": {"response": {"type": "array"}}},
                },
                {"name": "generate_topic"},
            ]
        }
    ]
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["final_result"]}}
    assert body["generationConfig"] == {
        "maxOutputTokens": 40,
        "stopSequences": ["END"],
        "temperature": 0.5,
        "seed": 7,
        "responseMimeType": "application/json",
    }


@pytest.mark.parametrize(("choice", "mode"), [("auto", "AUTO"), ("required", "ANY"), ("none", "NONE")])
def test_tool_choice_modes(choice: str, mode: str) -> None:
    _, body = _sent(_req(messages=[{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice=choice))
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": mode}}


def test_streams_go_to_the_sse_method_and_json_schema_is_native() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    url, body = _sent(
        _req(
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            logprobs=True,
            top_logprobs=3,
            response_format={"type": "json_schema", "json_schema": {"name": "A", "schema": schema}},
        )
    )
    assert url.endswith(":streamGenerateContent?alt=sse")
    assert body["generationConfig"] == {
        "responseLogprobs": True,
        "logprobs": 3,
        "responseMimeType": "application/json",
        "responseJsonSchema": schema,
    }


def test_what_gemini_cannot_take_is_refused() -> None:
    user = [{"role": "user", "content": "hi"}]
    with pytest.raises(UnsupportedParamError) as caught:
        _sent(_req(messages=user, tools=TOOLS, parallel_tool_calls=False))
    assert caught.value.param == "parallel_tool_calls"
    with pytest.raises(UnsupportedParamError) as logit:
        _sent(_req(messages=user, logit_bias={"1": 2}))
    assert logit.value.param == "logit_bias"
    with pytest.raises(UnsupportedParamError) as image:
        _sent(
            _req(
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}]
            )
        )
    assert image.value.param == "messages"
    bad = {"id": "t", "type": "function", "function": {"name": "f", "arguments": "[1]"}}
    with pytest.raises(InvalidRequestError):
        _sent(_req(messages=[*user, {"role": "assistant", "tool_calls": [bad]}]))
    # A result must answer a call: Gemini names results by their call's function.
    with pytest.raises(InvalidRequestError) as orphan:
        _sent(_req(messages=[*user, {"role": "tool", "tool_call_id": "nowhere", "content": "x"}]))
    assert orphan.value.param == "messages"
    with pytest.raises(InvalidRequestError) as guarded:
        _sent(_req(messages=user, inference_extra_params={"generationConfig": {"maxOutputTokens": 9}}))
    assert guarded.value.param == "inference_extra_params.generationConfig.maxOutputTokens"


def test_recorded_text_answer() -> None:
    recorded = fixture_json("gemini/generate_content_stop_sequence.json")
    answer = GeminiAdapter().parse_chat_response(fixture_bytes("gemini/generate_content_stop_sequence.json"), _ctx())
    (choice,) = answer.choices
    assert choice.message.content == recorded["candidates"][0]["content"]["parts"][0]["text"]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert answer.usage is not None and answer.usage.prompt_tokens == 25 and answer.usage.completion_tokens == 8


def test_recorded_function_calls_answer() -> None:
    recorded = fixture_json("gemini/generate_content_function_calls.json")
    answer = GeminiAdapter().parse_chat_response(fixture_bytes("gemini/generate_content_function_calls.json"), _ctx())
    (choice,) = answer.choices
    calls = choice.message.tool_calls or []
    parts = recorded["candidates"][0]["content"]["parts"]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (p["functionCall"]["name"], p["functionCall"]["args"]) for p in parts
    ]
    # Gemini's STOP after function calls is OpenAI's tool_calls; ids are unique; the signature rides the id.
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len({c.id for c in calls}) == 3
    assert calls[0].id.partition(SIGNATURE)[2] == parts[0]["thoughtSignature"]
    assert SIGNATURE not in calls[1].id
    # Thinking tokens are output tokens (the bill counts them).
    assert answer.usage is not None and answer.usage.completion_tokens == 30 + 292

    # The calls sent back on the next turn carry the signature where Gemini wants it.
    history = [
        {"role": "user", "content": "jokes"},
        {"role": "assistant", "tool_calls": [msgspec.to_builtins(c) for c in calls]},
        *[{"role": "tool", "tool_call_id": c.id, "content": "golf"} for c in calls],
    ]
    _, body = _sent(_req(messages=history, tools=TOOLS))
    model_turn, results = body["contents"][1], body["contents"][2]
    assert model_turn["parts"][0]["thoughtSignature"] == parts[0]["thoughtSignature"]
    assert [p["functionCall"]["id"] for p in model_turn["parts"]] == [
        p["functionResponse"]["id"] for p in results["parts"]
    ]
    assert all(SIGNATURE not in p["functionResponse"]["id"] for p in results["parts"])


def test_recorded_arguments_byte_for_byte_plain_and_streamed() -> None:
    raw = fixture_bytes("gemini/generate_content_function_args.json")
    args = fixture_json("gemini/generate_content_function_args.json")["candidates"][0]["content"]["parts"][0]
    want = json.dumps(args["functionCall"]["args"], separators=(",", ":"), ensure_ascii=False)
    answer = GeminiAdapter().parse_chat_response(raw, _ctx())
    (call,) = answer.choices[0].message.tool_calls or []
    assert call.function.arguments == want
    # The same answer as one stream event (a streamGenerateContent event is a GenerateContentResponse).
    chunks = _stream(b"data: " + json.dumps(json.loads(raw)).encode() + b"\r\n\r\n", _ctx())
    (chunk,) = chunks
    (delta,) = chunk.choices[0].delta.tool_calls or []
    assert (delta.index, delta.id, delta.type) == (0, call.id, "function")
    assert delta.function is not None and delta.function.name == "final_result"
    assert delta.function.arguments == want
    assert chunk.choices[0].delta.role == "assistant" and chunk.choices[0].finish_reason == "tool_calls"
    assert chunk.usage is not None and chunk.usage.total_tokens == 895


def test_recorded_function_call_stream() -> None:
    raw = fixture_bytes("gemini/stream_function_call.sse.txt")
    chunks = _stream(raw, _ctx())
    assert len(chunks) == 2
    first, last = chunks
    assert first.choices[0].delta.role == "assistant"
    (delta,) = first.choices[0].delta.tool_calls or []
    assert delta.function is not None and (delta.function.name, delta.function.arguments) == ("get_country", "{}")
    assert delta.id is not None and delta.id.partition(SIGNATURE)[2].startswith("Et8ECtwE")
    assert first.usage is None  # a running count: only the last event's is final
    assert last.choices[0].delta.role is None and last.choices[0].finish_reason == "tool_calls"
    assert last.usage is not None and last.usage.completion_tokens == 10 + 110


def test_recorded_text_stream() -> None:
    raw = fixture_bytes("gemini/stream_generate_content.sse.txt")
    chunks = _stream(raw, _ctx())
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "The capital of France is Paris.\n"
    assert [c.choices[0].delta.role for c in chunks] == ["assistant", None, None]
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, "stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 21


def test_logprobs_as_chat_logprobs() -> None:
    body = {
        "candidates": [
            {
                "content": {"parts": [{"text": "Hi there"}], "role": "model"},
                "finishReason": "STOP",
                "logprobsResult": {
                    "chosenCandidates": [{"token": "Hi", "logProbability": -0.5}, {"token": " there"}],
                    "topCandidates": [
                        {
                            "candidates": [
                                {"token": "Hi", "logProbability": -0.5},
                                {"token": "Hey", "logProbability": -1},
                            ]
                        },  # noqa: E501
                        {"candidates": [{"token": " there"}]},
                    ],
                },
            }
        ]
    }
    answer = GeminiAdapter().parse_chat_response(json.dumps(body).encode(), _ctx())
    lp = answer.choices[0].logprobs
    assert lp is not None and lp.content is not None
    tokens = [(t.token, t.logprob, t.bytes) for t in lp.content]
    assert tokens == [("Hi", -0.5, [72, 105]), (" there", 0.0, list(b" there"))]
    assert [(a.token, a.logprob) for a in lp.content[0].top_logprobs] == [("Hi", -0.5), ("Hey", -1.0)]


def test_blocked_prompt_and_errors() -> None:
    blocked = b'{"promptFeedback": {"blockReason": "SAFETY"}}'
    answer = GeminiAdapter().parse_chat_response(blocked, _ctx(n=2))
    assert [c.finish_reason for c in answer.choices] == ["content_filter", "content_filter"]
    error = b'{"error": {"code": 429, "message": "Resource exhausted", "status": "RESOURCE_EXHAUSTED"}}'
    with pytest.raises(UpstreamStatusError) as caught:
        GeminiAdapter().parse_chat_event(None, error, _ctx())
    assert caught.value.upstream_status == 429


def test_an_event_that_adds_nothing_is_skipped() -> None:
    ctx = _ctx()
    adapter = GeminiAdapter()
    first = b'{"candidates": [{"content": {"parts": [{"text": "Hi"}], "role": "model"}, "index": 0}]}'
    nothing = b'{"candidates": [{"content": {"parts": [{"text": ""}], "role": "model"}, "index": 0}]}'
    assert adapter.parse_chat_event(None, first, ctx) is not None
    assert adapter.parse_chat_event(None, nothing, ctx) is None


def test_recorded_thought_summaries_are_reasoning_content() -> None:
    # A Gemini 3 answer with `includeThoughts`: a thought part, then the answer's text part.
    recorded = fixture_json("gemini/generate_content_thoughts.json")
    thought, text = recorded["candidates"][0]["content"]["parts"]
    answer = GeminiAdapter().parse_chat_response(fixture_bytes("gemini/generate_content_thoughts.json"), _ctx())
    (choice,) = answer.choices
    assert thought["thought"] is True and "thought" not in text
    assert choice.message.reasoning_content == thought["text"]
    assert choice.message.content == text["text"]
    assert answer.usage is not None and answer.usage.completion_tokens_details is not None
    assert answer.usage.completion_tokens_details.reasoning_tokens == recorded["usageMetadata"]["thoughtsTokenCount"]
    # Streamed (Gemini 2.5 Pro): four thought events, then the answer's.
    raw = fixture_bytes("gemini/stream_generate_content_thoughts.sse.txt")
    events = [json.loads(line[len("data: ") :]) for line in raw.decode().splitlines() if line.startswith("data: ")]
    parts = [p for e in events for p in e["candidates"][0]["content"].get("parts", [])]
    chunks = _stream(raw, _ctx())
    reasoning = "".join(c.choices[0].delta.reasoning_content or "" for c in chunks)
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert reasoning == "".join(p["text"] for p in parts if p.get("thought"))
    assert content == "".join(p.get("text", "") for p in parts if not p.get("thought"))
    assert len(reasoning) > 100 and len(content) > 100
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.reasoning_content
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_n_is_candidate_count_and_each_candidate_a_choice() -> None:
    _, body = _sent(_req(messages=[{"role": "user", "content": "hi"}], n=2))
    assert body["generationConfig"] == {"candidateCount": 2}
    two = {
        "candidates": [
            {"content": {"parts": [{"text": "A"}]}, "finishReason": "STOP", "index": 0},
            {"content": {"parts": [{"text": "B"}]}, "finishReason": "MAX_TOKENS", "index": 1},
        ]
    }
    answer = GeminiAdapter().parse_chat_response(json.dumps(two).encode(), _ctx(n=2))
    assert [(c.index, c.message.content, c.finish_reason) for c in answer.choices] == [
        (0, "A", "stop"),
        (1, "B", "length"),
    ]
    ctx = _ctx(n=2)
    first = GeminiAdapter().parse_chat_event(None, json.dumps(two).encode(), ctx)
    assert first is not None
    assert [(c.index, c.delta.role, c.delta.content) for c in first.choices] == [
        (0, "assistant", "A"),
        (1, "assistant", "B"),
    ]
