"""Chat on Bedrock's Converse (providers/bedrock_chat.py): the conversation as Converse's turns and
`toolConfig`, signed like a completion, and the recorded answers and streams (text, tool use, reasoning
beside a tool call, structured output, `toolUse` input deltas) as chat shapes (tests/fixtures/SOURCES.md).
Frames the recordings lack (arguments in several pieces, two tools, exception frames) are built with
tests/helpers/eventstream.py, which test_bedrock_eventstream.py proves byte-exact on a recorded frame."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from gateway.path.chat_request import normalize_chat
from gateway.upstream.framing import DECODERS
from providers.base import CallContext, Endpoint, map_params
from providers.bedrock import DEFAULT_BASE_URL, BedrockAdapter
from providers.envelope import Unreadable
from tests.helpers.eventstream import event, exception, split_frames
from tests.helpers.recordings import fixture_bytes, fixture_json
from wire.chat import ChatChunk, ChatRequest, decode_chat
from wire.errors import InvalidRequestError, UnsupportedParamError, UpstreamStatusError

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
ADAPTER = BedrockAdapter(clock=lambda: NOW)
NOVA = "us.amazon.nova-micro-v1:0"
CLAUDE = "anthropic.claude-3-haiku-20240307-v1:0"
ENDPOINT = Endpoint(
    provider="aws",
    model=NOVA,
    base_url=DEFAULT_BASE_URL,
    api_key="AKIDEXAMPLE:wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    region="us-east-1",
)
# The tool of the recorded ConverseStream (pydantic-ai's test_bedrock_model_iter_stream), as OpenAI's tool.
CITY = {
    "properties": {"city": {"description": "The city name.", "title": "City", "type": "string"}},
    "required": ["city"],
    "type": "object",
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_temperature", "description": "Get the temperature in a city.", "parameters": CITY},
    }
]
USER = [{"role": "user", "content": "What is the temperature of the capital of France?"}]


def _ctx() -> CallContext:
    return CallContext(id="chatcmpl-b", created=1, model="aws/x", chat=True)


def _req(**body: Any) -> ChatRequest:
    req = decode_chat(msgspec.json.encode({"model": "aws/x", **body}))
    normalize_chat(req)
    return req


def _sent(req: ChatRequest, endpoint: Endpoint = ENDPOINT) -> tuple[str, dict[str, str], dict[str, Any]]:
    assert ADAPTER.chat_params is not None
    params, _ = map_params(req, ADAPTER.chat_params, endpoint.provider, False)
    up = ADAPTER.build_chat_request(req, endpoint, params)
    return up.url, up.headers, json.loads(up.body)


def _body(**body: Any) -> dict[str, Any]:
    return _sent(_req(**body))[2]


def test_the_recorded_conversation_translates_to_the_recorded_converse_turns() -> None:
    # The second request of the recording: the model's text and tool call, the tool's result.
    thought = "<thinking> To find the temperature of the capital of France, I need to ... </thinking>\n"
    call = {
        "id": "tooluse_lAG_zP8QRHmSYOwZzzaCqA",
        "type": "function",
        "function": {"name": "get_temperature", "arguments": '{"city":"Paris"}'},
    }
    url, headers, body = _sent(
        _req(
            messages=[
                {"role": "system", "content": "You are a helpful chatbot."},
                *USER,
                {"role": "assistant", "content": thought, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "tooluse_lAG_zP8QRHmSYOwZzzaCqA", "content": "30°C"},
            ],
            tools=TOOLS,
            top_p=0.5,
        )
    )
    assert url == f"{DEFAULT_BASE_URL.replace('{region}', 'us-east-1')}/model/{NOVA}/converse"
    assert headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260102/us-east-1/bedrock/")
    assert body == {
        "messages": [
            {"role": "user", "content": [{"text": USER[0]["content"]}]},
            {
                "role": "assistant",
                "content": [
                    {"text": thought},
                    {
                        "toolUse": {
                            "toolUseId": "tooluse_lAG_zP8QRHmSYOwZzzaCqA",
                            "name": "get_temperature",
                            "input": {"city": "Paris"},
                        }
                    },
                ],
            },
            # The recording also sends `status: success`, which Converse takes for Nova and Claude only.
            {
                "role": "user",
                "content": [
                    {"toolResult": {"toolUseId": "tooluse_lAG_zP8QRHmSYOwZzzaCqA", "content": [{"text": "30°C"}]}}
                ],
            },
        ],
        "system": [{"text": "You are a helpful chatbot."}],
        "inferenceConfig": {"topP": 0.5},
        "toolConfig": {
            "tools": [
                {
                    "toolSpec": {
                        "name": "get_temperature",
                        "description": "Get the temperature in a city.",
                        "inputSchema": {"json": CITY},
                    }
                }
            ]
        },
    }


def test_turns_of_one_role_merge_and_empty_text_is_left_out() -> None:
    call = {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = _body(
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "t1", "content": "one"},
            {"role": "user", "content": "Thanks"},
        ],
        tools=TOOLS,
    )
    assert body["system"] == [{"text": "Use tools."}, {"text": "Be brief."}]
    assert body["messages"] == [
        {"role": "user", "content": [{"text": "a"}, {"text": "b"}]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "f", "input": {}}}]},
        {
            "role": "user",
            "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "one"}]}}, {"text": "Thanks"}],
        },
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"auto": {}}),
        ("required", {"any": {}}),
        ({"type": "function", "function": {"name": "get_temperature"}}, {"tool": {"name": "get_temperature"}}),
    ],
)
def test_tool_choice(choice: Any, expected: dict[str, Any]) -> None:
    body = _body(messages=USER, tools=TOOLS, tool_choice=choice, parallel_tool_calls=True)
    assert body["toolConfig"]["toolChoice"] == expected
    assert len(body["toolConfig"]["tools"]) == 1


def test_sampling_fields_and_strict_tools() -> None:
    tools = [{"type": "function", "function": {"name": "f", "strict": True}}]
    body = _body(
        messages=USER,
        tools=tools,
        max_completion_tokens=50,
        temperature=0.3,
        stop="END",
        user="u-1",
        top_k=20,
    )
    assert body["inferenceConfig"] == {"maxTokens": 50, "temperature": 0.3, "stopSequences": ["END"]}
    assert body["requestMetadata"] == {"user": "u-1"}
    assert body["additionalModelRequestFields"] == {"inferenceConfig": {"topK": 20}}
    assert body["toolConfig"]["tools"] == [
        {"toolSpec": {"name": "f", "inputSchema": {"json": {"type": "object", "properties": {}}}, "strict": True}}
    ]


def test_json_schema_is_bedrocks_structured_output() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "CityInfo", "description": "A city.", "schema": schema}}
    body = _body(messages=USER, response_format=fmt)
    # As the recorded request (pydantic-ai test_bedrock_native_output_supported_model): the schema as a string.
    assert body["outputConfig"] == {
        "textFormat": {
            "type": "json_schema",
            "structure": {
                "jsonSchema": {
                    "name": "CityInfo",
                    "schema": json.dumps(schema, separators=(",", ":")),
                    "description": "A city.",
                }
            },
        }
    }
    assert "outputConfig" not in _body(messages=USER, response_format={"type": "text"})


def test_an_inline_image_is_an_image_block() -> None:
    url = "data:image/png;base64,iVBORw0KGgo="
    body = _body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
    assert body["messages"][0]["content"] == [{"image": {"format": "png", "source": {"bytes": "iVBORw0KGgo="}}}]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"seed": 1}, "seed"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"1": 2}}, "logit_bias"),
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": TOOLS, "tool_choice": "none"}, "tool_choice"),
        ({"tools": TOOLS, "parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}
                ]
            },
            "messages",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:image/bmp;base64,AA=="}}],
                    }
                ]
            },
            "messages",
        ),
    ],
)
def test_what_converse_cannot_honour_is_refused_naming_field_and_provider(body: dict[str, Any], field: str) -> None:
    with pytest.raises(UnsupportedParamError) as caught:
        _sent(_req(**{"messages": USER, **body}))
    assert caught.value.param == field
    assert "'aws'" in caught.value.message


def test_bad_values_are_400s() -> None:
    with pytest.raises(InvalidRequestError) as range_error:
        _body(messages=USER, temperature=1.5)
    assert range_error.value.param == "temperature"
    bad = {"id": "t", "type": "function", "function": {"name": "f", "arguments": "[1]"}}
    with pytest.raises(InvalidRequestError) as args_error:
        _body(messages=[*USER, {"role": "assistant", "tool_calls": [bad]}])
    assert args_error.value.param == "messages"
    with pytest.raises(InvalidRequestError):
        _body(
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,%%"}}]}
            ]
        )
    with pytest.raises(InvalidRequestError) as guarded:
        _body(messages=USER, inference_extra_params={"inferenceConfig": {"maxTokens": 10**6}})
    assert guarded.value.param == "inference_extra_params.inferenceConfig.maxTokens"


def test_stream_goes_to_converse_stream_and_extra_params_nest() -> None:
    url, _, body = _sent(
        _req(messages=USER, stream=True, max_tokens=5, inference_extra_params={"inferenceConfig": {"topP": 0.9}})
    )
    assert url.endswith(f"/model/{NOVA}/converse-stream")
    assert body["inferenceConfig"] == {"maxTokens": 5, "topP": 0.9}
    assert "stream" not in body


# --- answers ------------------------------------------------------------------------------------------


def test_recorded_tool_use_answer() -> None:
    recorded = fixture_json("bedrock/converse_tool_use.json")
    answer = ADAPTER.parse_chat_response(fixture_bytes("bedrock/converse_tool_use.json"), _ctx())
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


def test_recorded_reasoning_is_reasoning_content_not_content() -> None:
    recorded = fixture_json("bedrock/converse_reasoning_tool_use.json")["output"]["message"]["content"][0]
    answer = ADAPTER.parse_chat_response(fixture_bytes("bedrock/converse_reasoning_tool_use.json"), _ctx())
    (choice,) = answer.choices
    assert choice.message.content is None and choice.finish_reason == "tool_calls"
    assert choice.message.reasoning_content == recorded["reasoningContent"]["reasoningText"]["text"]
    calls = choice.message.tool_calls or []
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("functions.get_temperature:0", "get_temperature", '{"city":"London"}')
    ]


@pytest.mark.parametrize(
    ("name", "finish"),
    [("converse_end_turn.json", "stop"), ("converse_max_tokens.json", "length"), ("converse_json_schema.json", "stop")],
)
def test_recorded_text_answers(name: str, finish: str) -> None:
    recorded = fixture_json(f"bedrock/{name}")
    answer = ADAPTER.parse_chat_response(fixture_bytes(f"bedrock/{name}"), _ctx())
    (choice,) = answer.choices
    assert choice.message.content == recorded["output"]["message"]["content"][0]["text"]
    assert choice.message.tool_calls is None and choice.finish_reason == finish
    assert answer.id == "chatcmpl-b" and answer.model == "aws/x"


def test_recorded_cache_read_usage() -> None:
    answer = ADAPTER.parse_chat_response(fixture_bytes("bedrock/converse_cache_read.json"), _ctx())
    assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    assert answer.usage.prompt_tokens_details.cached_tokens == 1504


def test_errors_in_a_200_and_answers_without_output() -> None:
    with pytest.raises(UpstreamStatusError) as caught:
        ADAPTER.parse_chat_response(b'{"__type":"ThrottlingException","message":"Too many"}', _ctx())
    assert caught.value.upstream_status == 429
    with pytest.raises(Unreadable):
        ADAPTER.parse_chat_response(b'{"stopReason":"end_turn"}', _ctx())


# --- streams ------------------------------------------------------------------------------------------


def _chunks(raw: bytes) -> list[ChatChunk]:
    decoder = DECODERS["eventstream"](max_event_bytes=1 << 20)
    ctx = _ctx()
    out = []
    for name, data in [*decoder.feed(raw), *decoder.close()]:
        chunk = ADAPTER.parse_chat_event(name, data, ctx)
        if chunk is not None:
            out.append(chunk)
    return out


def _calls(chunks: list[ChatChunk]) -> dict[int, list[str]]:
    got: dict[int, list[str]] = {}
    for c in chunks:
        for choice in c.choices:
            for tc in choice.delta.tool_calls or ():
                slot = got.setdefault(tc.index, ["", "", ""])
                slot[0] += tc.id or ""
                slot[1] += (tc.function.name if tc.function else None) or ""
                slot[2] += (tc.function.arguments if tc.function else None) or ""
    return got


def _payloads(raw: bytes) -> list[dict[str, Any]]:
    # Each frame's JSON payload: after the 12-byte prelude and the headers, before the 4-byte CRC.
    out = []
    for f in split_frames(raw):
        headers_length = int.from_bytes(f[4:8], "big")
        out.append(json.loads(f[12 + headers_length : -4]))
    return out


def test_recorded_tool_use_stream() -> None:
    raw = fixture_bytes("bedrock/converse_stream_tool_use.eventstream")
    chunks = _chunks(raw)
    events = _payloads(raw)
    text = "".join(e["delta"].get("text", "") for e in events if "delta" in e)
    start = next(e["start"]["toolUse"] for e in events if "start" in e)
    pieces = "".join(e["delta"]["toolUse"]["input"] for e in events if "toolUse" in e.get("delta", {}))

    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert _calls(chunks) == {0: [start["toolUseId"], start["name"], pieces]}
    assert pieces == '{"city":"Paris"}'
    finish = chunks[-2]
    assert finish.choices[0].finish_reason == "tool_calls" and finish.usage is None
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (471, 91, 562)
    assert {c.id for c in chunks} == {"chatcmpl-b"}


def test_recorded_reasoning_stream() -> None:
    # Claude on Bedrock with thinking on: block 0's reasoningContent pieces (and its signature), then text.
    raw = fixture_bytes("bedrock/converse_stream_reasoning.eventstream")
    chunks = [c for c in _chunks(raw) if c.choices]
    deltas = [e["delta"] for e in _payloads(raw) if "delta" in e]
    reasoning = "".join(c.choices[0].delta.reasoning_content or "" for c in chunks)
    assert reasoning == "".join(d["reasoningContent"].get("text", "") for d in deltas if "reasoningContent" in d)
    assert reasoning.startswith("The user has greeted me")
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert content == "".join(d.get("text", "") for d in deltas) and content.endswith("you today?")
    assert chunks[-1].choices[0].finish_reason == "stop"
    # The signed block whole, in a chunk of its own when block 0 stops, before the text.
    signature = "".join(d["reasoningContent"].get("signature", "") for d in deltas if "reasoningContent" in d)
    signed = [
        (i, c.choices[0].delta.thinking_blocks) for i, c in enumerate(chunks) if c.choices[0].delta.thinking_blocks
    ]
    assert [(b, msgspec.to_builtins(blocks)) for b, blocks in signed] == [
        (signed[0][0], [{"type": "thinking", "thinking": reasoning, "signature": signature}])
    ]
    assert signature.startswith("Eu0CCkgIBxAB")
    assert signed[0][0] < next(i for i, c in enumerate(chunks) if c.choices[0].delta.content)


def test_signed_and_redacted_reasoning_blocks_as_thinking_blocks() -> None:
    # Converse's ReasoningContentBlock (docs.aws.amazon.com/bedrock/latest/APIReference/
    # API_runtime_ReasoningContentBlock.html): `reasoningText` {text, signature} or `redactedContent` (a blob,
    # base64 in JSON). The recorded answer (no signature: not Claude) lists no block.
    unsigned = ADAPTER.parse_chat_response(fixture_bytes("bedrock/converse_reasoning_tool_use.json"), _ctx())
    assert unsigned.choices[0].message.thinking_blocks is None
    recorded = fixture_json("bedrock/converse_reasoning_tool_use.json")
    blocks = recorded["output"]["message"]["content"]
    blocks[0]["reasoningContent"]["reasoningText"]["signature"] = "Eu0CCkgIBxAB"
    blocks.insert(1, {"reasoningContent": {"redactedContent": "AQIDBA=="}})
    answer = ADAPTER.parse_chat_response(msgspec.json.encode(recorded), _ctx())
    text = blocks[0]["reasoningContent"]["reasoningText"]["text"]
    assert msgspec.to_builtins(answer.choices[0].message.thinking_blocks) == [
        {"type": "thinking", "thinking": text, "signature": "Eu0CCkgIBxAB"},
        {"type": "redacted_thinking", "data": "AQIDBA=="},
    ]
    assert answer.choices[0].message.reasoning_content == text


def test_thinking_blocks_sent_back_lead_their_turn() -> None:
    call = {"id": "tooluse_1", "type": "function", "function": {"name": "get_temperature", "arguments": "{}"}}
    turn = {
        "role": "assistant",
        "tool_calls": [call],
        "reasoning_content": "Let me look.",
        "thinking_blocks": [
            {"type": "thinking", "thinking": "Let me look.", "signature": "Eu0CCkgIBxAB"},
            {"type": "redacted_thinking", "data": "AQIDBA=="},
            {"type": "thinking", "thinking": "no signature: left out"},
        ],
    }
    body = _body(
        messages=[*USER, turn, {"role": "tool", "tool_call_id": "tooluse_1", "content": "30"}],
        tools=TOOLS,
    )
    assert body["messages"][1]["content"] == [
        {"reasoningContent": {"reasoningText": {"text": "Let me look.", "signature": "Eu0CCkgIBxAB"}}},
        {"reasoningContent": {"redactedContent": "AQIDBA=="}},
        {"toolUse": {"toolUseId": "tooluse_1", "name": "get_temperature", "input": {}}},
    ]


def test_recorded_text_stream() -> None:
    chunks = _chunks(fixture_bytes("bedrock/converse_stream.eventstream"))
    content = [c for c in chunks if c.choices]
    assert content[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in content][-2:] == [None, "stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 82


def _two_tools_stream(a: list[str], b: list[str]) -> bytes:
    frames = [event("messageStart", {"role": "assistant"})]
    frames.append(event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Checking."}}))
    frames.append(event("contentBlockStop", {"contentBlockIndex": 0}))
    for index, (name, pieces) in enumerate((("get_capital", a), ("get_temperature", b)), start=1):
        use = {"toolUse": {"toolUseId": f"tooluse_{index}", "name": name}}
        frames.append(event("contentBlockStart", {"contentBlockIndex": index, "start": use}))
        for piece in pieces:
            frames.append(
                event("contentBlockDelta", {"contentBlockIndex": index, "delta": {"toolUse": {"input": piece}}})
            )
        frames.append(event("contentBlockStop", {"contentBlockIndex": index}))
    frames.append(event("messageStop", {"stopReason": "tool_use"}))
    frames.append(event("metadata", {"usage": {"inputTokens": 10, "outputTokens": 20, "totalTokens": 30}}))
    return b"".join(frames)


def test_argument_pieces_arrive_byte_for_byte_per_tool() -> None:
    a = ['{"coun', 'try": ', '"Fran', 'ce"}']
    b = ["{", '"city":"Par', 'is \\u00e9"', "}"]
    chunks = _chunks(_two_tools_stream(a, b))
    assert _calls(chunks) == {
        0: ["tooluse_1", "get_capital", "".join(a)],
        1: ["tooluse_2", "get_temperature", "".join(b)],
    }
    # One chunk per piece, in the upstream's order.
    pieces = [
        tc.function.arguments
        for c in chunks
        for tc in (c.choices[0].delta.tool_calls or () if c.choices else ())
        if tc.function and tc.function.arguments
    ]
    assert pieces == a + b


def test_an_exception_frame_mid_stream_raises_its_error() -> None:
    frames = split_frames(fixture_bytes("bedrock/converse_stream.eventstream"))
    raw = frames[0] + frames[1] + exception("throttlingException", "Too many requests")
    with pytest.raises(UpstreamStatusError) as caught:
        _chunks(raw)
    assert caught.value.upstream_status == 429
    assert caught.value.code == "ThrottlingException"


def test_a_guardrail_stop_is_content_filter() -> None:
    raw = b"".join(
        [
            event("messageStart", {"role": "assistant"}),
            event("messageStop", {"stopReason": "guardrail_intervened"}),
        ]
    )
    assert _chunks(raw)[-1].choices[0].finish_reason == "content_filter"


def test_chat_is_declared_for_the_docs() -> None:
    assert ADAPTER.chat_framing == "eventstream"
    assert ADAPTER.chat_params is not None and "tools" in ADAPTER.chat_params
    with pytest.raises(UnsupportedParamError):
        _sent(
            _req(messages=USER, top_k=5), Endpoint(provider="aws", model="meta.llama3", base_url="", region="us-east-1")
        )
    assert _sent(_req(messages=USER, top_k=5), Endpoint(provider="aws", model=CLAUDE, base_url="", region="us-east-1"))[
        2
    ]["additionalModelRequestFields"] == {"top_k": 5}
