"""Chat on AWS Bedrock end to end: the gateway (uvicorn, real socket) in front of a loopback upstream speaking
Converse, from the real recordings (tests/fixtures/bedrock, see SOURCES.md) byte for byte, the ConverseStream
bodies as binary event-stream frames (recorded, or built with correct CRCs by tests/helpers/eventstream.py)
in odd-sized writes. Clients are the official `openai` SDK and raw httpx asking `/v1/chat/completions`; the
upstream checks every request's SigV4 signature as AWS does (test_bedrock_e2e.check_sigv4)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from tests.helpers.clients import sse_data
from tests.helpers.eventstream import event, exception, split_frames
from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.helpers.upstreams import Upstream, reply
from tests.native.test_bedrock_e2e import CONFIG, GATEWAY_ENV, NOVA, Checked, reply_eventstream

__all__ = ["CONFIG", "GATEWAY_ENV"]  # read by tests/native/conftest.py

MODEL = "aws/" + NOVA
TOOL_STREAM = "bedrock/converse_stream_tool_use.eventstream"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_temperature",
            "description": "Get the temperature in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
USER: list[Any] = [{"role": "user", "content": "What is the temperature of the capital of France?"}]


def assert_error(
    resp: httpx.Response, *, status: int, type: str, message: str, code: str, param: str | None = None
) -> None:
    """OpenAI's error envelope, compared exactly (the chat route speaks the completions route's dialect)."""
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    expected = {"error": {"message": message, "type": type, "param": param, "code": code}}
    assert (resp.status_code, resp.json()) == (status, expected)


def _path(upstream: Upstream) -> str:
    sent = upstream.only()
    assert sent.method == "POST" and sent.headers["content-type"] == "application/json"
    return sent.path


def test_sdk_tool_call_from_the_recorded_answer(oai: openai.OpenAI, upstream: Upstream) -> None:
    checked = Checked()
    upstream.handler = checked.wrap(reply(fixture_bytes("bedrock/converse_tool_use.json")))
    recorded = fixture_json("bedrock/converse_tool_use.json")["output"]["message"]["content"][0]["toolUse"]
    answer = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "You are a helpful chatbot."}, *USER],
        tools=TOOLS,
        tool_choice="required",
        max_tokens=100,
    )
    assert answer.id.startswith("chatcmpl-") and answer.object == "chat.completion" and answer.model == MODEL
    (choice,) = answer.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        recorded["toolUseId"],
        recorded["name"],
        recorded["input"],
    )
    assert answer.usage is not None and (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (571, 22)
    assert checked.verdicts == [None]
    assert _path(upstream) == f"/model/{NOVA}/converse"
    assert upstream.only().json() == {
        "messages": [{"role": "user", "content": [{"text": USER[0]["content"]}]}],
        "system": [{"text": "You are a helpful chatbot."}],
        "inferenceConfig": {"maxTokens": 100},
        "toolConfig": {
            "tools": [
                {
                    "toolSpec": {
                        "name": "get_temperature",
                        "description": "Get the temperature in a city.",
                        "inputSchema": {"json": TOOLS[0]["function"]["parameters"]},
                    }
                }
            ],
            "toolChoice": {"any": {}},
        },
    }


def test_sdk_the_tool_result_turn_and_the_recorded_text_answer(oai: openai.OpenAI, upstream: Upstream) -> None:
    upstream.handler = reply(fixture_bytes("bedrock/converse_end_turn.json"))
    call: Any = {
        "id": "tooluse_1",
        "type": "function",
        "function": {"name": "get_temperature", "arguments": '{"city":"Paris"}'},
    }
    answer = oai.chat.completions.create(
        model=MODEL,
        messages=[
            *USER,
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "tooluse_1", "content": "30°C"},
        ],
        tools=TOOLS,
    )
    assert (
        answer.choices[0].message.content
        == fixture_json("bedrock/converse_end_turn.json")["output"]["message"]["content"][0]["text"]
    )
    assert answer.choices[0].finish_reason == "stop"
    assert upstream.only().json()["messages"][1:] == [
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "tooluse_1", "name": "get_temperature", "input": {"city": "Paris"}}}],
        },
        {"role": "user", "content": [{"toolResult": {"toolUseId": "tooluse_1", "content": [{"text": "30°C"}]}}]},
    ]


@pytest.mark.parametrize("size", [1, 13, 100_000])
def test_sdk_streamed_tool_call_from_the_recorded_stream(oai: openai.OpenAI, upstream: Upstream, size: int) -> None:
    checked = Checked()
    upstream.handler = checked.wrap(reply_eventstream(fixture_bytes(TOOL_STREAM), size))
    stream = oai.chat.completions.create(
        model=MODEL, messages=USER, tools=TOOLS, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].id.startswith("chatcmpl-")
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("<thinking> To find the temperature") and text.endswith("</thinking>\n")
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert [(tc.index, tc.id, tc.function.name if tc.function else None) for tc in calls][0] == (
        0,
        "tooluse_lAG_zP8QRHmSYOwZzzaCqA",
        "get_temperature",
    )
    assert "".join((tc.function.arguments or "") for tc in calls if tc.function) == '{"city":"Paris"}'
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (471, 91, 562)
    assert checked.verdicts == [None]
    assert _path(upstream) == f"/model/{NOVA}/converse-stream"


def test_raw_stream_of_two_tools_in_pieces_without_usage(api: httpx.Client, upstream: Upstream) -> None:
    pieces = {1: ['{"coun', 'try": "Fr', 'ance"}'], 2: ["{", '"city": "Pa', 'ris"', "}"]}
    frames = [event("messageStart", {"role": "assistant"})]
    for index, name in ((1, "get_capital"), (2, "get_temperature")):
        start = {"toolUse": {"toolUseId": f"tooluse_{index}", "name": name}}
        frames.append(event("contentBlockStart", {"contentBlockIndex": index, "start": start}))
        for piece in pieces[index]:
            frames.append(
                event("contentBlockDelta", {"contentBlockIndex": index, "delta": {"toolUse": {"input": piece}}})
            )
        frames.append(event("contentBlockStop", {"contentBlockIndex": index}))
    frames.append(event("messageStop", {"stopReason": "tool_use"}))
    frames.append(event("metadata", {"usage": {"inputTokens": 9, "outputTokens": 8, "totalTokens": 17}}))
    upstream.handler = reply_eventstream(b"".join(frames), 7)
    resp = api.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "tools": TOOLS, "stream": True})
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)
    joined: dict[int, list[str]] = {}
    for c in chunks:
        for tc in c["choices"][0]["delta"].get("tool_calls", []):
            slot = joined.setdefault(tc["index"], ["", "", ""])
            slot[0] += tc.get("id", "")
            slot[1] += tc.get("function", {}).get("name", "")
            slot[2] += tc.get("function", {}).get("arguments", "")
    assert joined == {
        0: ["tooluse_1", "get_capital", "".join(pieces[1])],
        1: ["tooluse_2", "get_temperature", "".join(pieces[2])],
    }
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_structured_output_with_the_sdks_parse(oai: openai.OpenAI, upstream: Upstream) -> None:
    class CityInfo(BaseModel):
        city: str
        country: str
        population: int

    upstream.handler = reply(fixture_bytes("bedrock/converse_json_schema.json"))
    parsed = oai.beta.chat.completions.parse(model=MODEL, messages=USER, response_format=CityInfo)
    assert parsed.choices[0].message.parsed == CityInfo(city="Paris", country="France", population=2161000)
    text_format = upstream.only().json()["outputConfig"]["textFormat"]
    assert text_format["type"] == "json_schema"
    definition = text_format["structure"]["jsonSchema"]
    assert definition["name"] == "CityInfo"
    assert json.loads(definition["schema"])["required"] == ["city", "country", "population"]


def test_recorded_throttling_reaches_the_chat_client_as_429(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(
        fixture_bytes("bedrock/error_429_throttling.json"),
        status=429,
        headers={"x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"},
    )
    resp = api.post("/v1/chat/completions", json={"model": MODEL, "messages": USER})
    assert_error(
        resp,
        status=429,
        type="rate_limit_error",
        message="aws error (429): Rate exceeded",
        code="throttling_exception",
    )


def test_an_exception_frame_mid_chat_stream_is_an_error_event(api: httpx.Client, upstream: Upstream) -> None:
    frames = split_frames(fixture_bytes("bedrock/converse_stream.eventstream"))
    upstream.handler = reply_eventstream(
        frames[0] + frames[1] + exception("modelStreamErrorException", "Model stream error"), 5
    )
    resp = api.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "stream": True})
    assert resp.status_code == 200
    data = sse_data(resp.text)
    assert json.loads(data[0])["choices"][0]["delta"]["role"] == "assistant"
    assert json.loads(data[1])["choices"][0]["delta"]["content"] == "The"
    assert json.loads(data[2]) == {
        "error": {
            "message": "bedrock error (424): Model stream error",
            "type": "upstream_error",
            "param": None,
            "code": "model_stream_error_exception",
        }
    }
    assert data[3:] == ["[DONE]"]


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"seed": 7}, "seed", "Parameter 'seed' is not supported by provider 'aws'"),
        ({"logprobs": True}, "logprobs", "Parameter 'logprobs' is not supported by provider 'aws'"),
        (
            {"response_format": {"type": "json_object"}},
            "response_format",
            "Provider 'aws' takes no 'response_format' of type 'json_object' on chat, and has no guided decoding "
            "the gateway could send it as",
        ),
        (
            {"tools": TOOLS, "tool_choice": "none"},
            "tool_choice",
            "Provider 'aws' does not support 'tool_choice: none' (Converse's tool choice is auto, any or a named tool)",
        ),
    ],
)
def test_what_converse_cannot_do_is_refused_before_any_call(
    api: httpx.Client, upstream: Upstream, extra: dict[str, Any], param: str, message: str
) -> None:
    resp = api.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, **extra})
    assert_error(
        resp,
        status=400,
        type="invalid_request_error",
        message=message,
        param=param,
        code="unsupported_parameter",
    )
    assert upstream.received == []


def test_an_exception_frame_before_any_event_is_the_chat_streams_error_status(
    api: httpx.Client, upstream: Upstream
) -> None:
    upstream.handler = reply_eventstream(exception("throttlingException", "Too many requests, please wait."), 3)
    resp = api.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "stream": True})
    assert_error(
        resp,
        status=429,
        type="rate_limit_error",
        message="bedrock error (429): Too many requests, please wait.",
        code="throttling_exception",
    )


def test_n_is_fanned_out_one_converse_call_per_choice(api: httpx.Client, upstream: Upstream) -> None:
    checked = Checked()
    upstream.handler = checked.wrap(reply(fixture_bytes("bedrock/converse_end_turn.json")))
    recorded = fixture_json("bedrock/converse_end_turn.json")
    resp = api.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "n": 2})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    text = recorded["output"]["message"]["content"][0]["text"]
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (0, text, "stop"),
        (1, text, "stop"),
    ]
    usage = recorded["usage"]
    assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (
        2 * usage["inputTokens"],
        2 * usage["outputTokens"],
    )
    # Two signed Converse calls, neither naming a count (Converse has none).
    assert checked.verdicts == [None, None]
    assert [r.json() for r in upstream.received] == [
        {"messages": [{"role": "user", "content": [{"text": USER[0]["content"]}]}]}
    ] * 2


def test_n_is_fanned_out_in_streams(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_eventstream(fixture_bytes(TOOL_STREAM), 13)
    body = {"model": MODEL, "messages": USER, "tools": TOOLS, "n": 2, "stream": True}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    assert data[-1] == "[DONE]"
    per: dict[int, list[dict[str, Any]]] = {}
    for c in (json.loads(d) for d in data[:-1]):
        for ch in c["choices"]:
            per.setdefault(ch["index"], []).append(ch)
    assert sorted(per) == [0, 1]
    for choices in per.values():  # each choice the whole recorded turn: its text, then its tool call
        assert choices[0]["delta"].get("role") == "assistant"
        calls = [tc for ch in choices for tc in ch["delta"].get("tool_calls") or ()]
        assert "".join(tc["function"].get("arguments") or "" for tc in calls) == '{"city":"Paris"}'
        assert choices[-1]["finish_reason"] == "tool_calls"
    assert len(upstream.received) == 2
    assert all(r.path == f"/model/{NOVA}/converse-stream" for r in upstream.received)


def test_stops_all_reach_converse(api: httpx.Client, upstream: Upstream) -> None:
    # Converse takes up to 2500 stop sequences, more than a request may carry (64): none is the gateway's.
    upstream.handler = reply(fixture_bytes("bedrock/converse_end_turn.json"))
    stops = [f"s{i}" for i in range(10)]
    resp = api.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "stop": stops})
    assert resp.status_code == 200, resp.text
    assert upstream.only().json()["inferenceConfig"]["stopSequences"] == stops


def test_the_stop_nova_kept_is_cut_by_the_gateway(api: httpx.Client, upstream: Upstream) -> None:
    # Recorded: Amazon Nova answered "Paris" to stopSequences ["Paris"], keeping the stop it matched.
    upstream.handler = reply(fixture_bytes("bedrock/converse_stop_nova_keeps_stop_text.json"))
    resp = api.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "stop": ["Paris"]})
    assert resp.status_code == 200, resp.text
    (choice,) = resp.json()["choices"]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("", "stop")
    assert upstream.only().json()["inferenceConfig"]["stopSequences"] == ["Paris"]
