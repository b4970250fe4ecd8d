"""The official `openai` Python SDK's chat surface, unmodified, through the gateway over real sockets:
`chat.completions.create` plain and streamed, `tools=` with the streamed calls reassembled and an agent turn
answering them, `chat.completions.parse` (and `beta.chat.completions.parse`) and `chat.completions.stream`
with a Pydantic model, logprobs and `n`. The upstream is `ChatLike` (chatlike.py), OpenAI's chat route
computing its answer from the request, behind a provider of kind openai (`oa`) and of kind vllm (`vc`);
each answer through the gateway is compared with what that upstream answers the body the gateway sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall, ChatCompletionMessageParam
from pydantic import BaseModel

from tests.helpers.clients import openai_client
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream

from .chatlike import ChatLike
from .conftest import CLIENTS_KEY

MODELS = [pytest.param("oa/gpt-4o-mini", id="openai"), pytest.param("vc/Qwen/Qwen2.5-1.5B-Instruct", id="vllm")]
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 2 + 2?"},
]
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "kelvin"]}},
            "required": ["city", "unit"],
        },
    },
}


class Forecast(BaseModel):
    city: str
    temperature_c: float
    sunny: bool
    hours: list[int]


@pytest.fixture(scope="module")
def client(gateway: GatewayThread) -> Iterator[openai.OpenAI]:
    with openai_client(gateway.url + "/v1", CLIENTS_KEY) as c:
        yield c


def _sent(upstream: Upstream) -> dict[str, Any]:
    body: dict[str, Any] = upstream.received[-1].json()
    return body


@pytest.mark.parametrize("model", MODELS)
def test_create_plain_and_streamed_say_the_same(
    client: openai.OpenAI, chat_upstream: Upstream, chat_like: ChatLike, model: str
) -> None:
    plain = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, seed=7)
    direct = chat_like.answer(_sent(chat_upstream))
    assert plain.object == "chat.completion" and plain.model == model
    assert plain.choices[0].message.content == direct["choices"][0]["message"]["content"]
    assert plain.choices[0].finish_reason == direct["choices"][0]["finish_reason"]
    assert plain.usage is not None and plain.usage.model_dump(exclude_none=True) == direct["usage"]

    chunks = list(
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=8, seed=7, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        plain.choices[0].finish_reason
    ]
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage

    # Not asked for, the usage chunk is not relayed (the gateway asked the upstream for it all the same).
    bare = list(client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, seed=7, stream=True))
    assert all(c.choices and c.usage is None for c in bare)
    assert _sent(chat_upstream)["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("model", MODELS)
def test_streamed_tool_calls_reassemble_into_the_plain_answers_call(
    client: openai.OpenAI, chat_upstream: Upstream, model: str
) -> None:
    plain = client.chat.completions.create(model=model, messages=MESSAGES, tools=[WEATHER_TOOL], tool_choice="auto")
    assert plain.choices[0].finish_reason == "tool_calls" and plain.choices[0].message.content is None
    (call,) = plain.choices[0].message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["unit"] == "celsius"
    assert _sent(chat_upstream)["tools"] == [WEATHER_TOOL]

    stream = client.chat.completions.create(model=model, messages=MESSAGES, tools=[WEATHER_TOOL], stream=True)
    calls: dict[int, dict[str, str]] = {}
    pieces = 0
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or ():
                slot = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += delta.id or ""
                if delta.function is not None:
                    slot["name"] += delta.function.name or ""
                    slot["arguments"] += delta.function.arguments or ""
                    pieces += 1
    assert pieces > 3  # the arguments really came in pieces
    assert calls == {0: {"id": call.id, "name": call.function.name, "arguments": call.function.arguments}}
    assert finish == "tool_calls"


@pytest.mark.parametrize("model", MODELS)
def test_an_agent_turn_sends_the_call_and_its_result_back(
    client: openai.OpenAI, chat_upstream: Upstream, model: str
) -> None:
    """The assistant's tool call, as the SDK returned it, goes back with the tool's result: the next answer."""
    first = client.chat.completions.create(model=model, messages=MESSAGES, tools=[WEATHER_TOOL])
    message = first.choices[0].message
    (call,) = message.tool_calls or []
    history: list[ChatCompletionMessageParam] = [
        *MESSAGES,
        message.model_dump(exclude_none=True),  # type: ignore[list-item]
        {"role": "tool", "tool_call_id": call.id, "content": "21 degrees"},
    ]
    second = client.chat.completions.create(model=model, messages=history, tools=[WEATHER_TOOL])
    assert second.choices[0].message.content == " The tool said: 21 degrees"
    assert second.choices[0].finish_reason == "stop"
    sent = _sent(chat_upstream)["messages"]
    assert sent[2]["tool_calls"][0]["id"] == call.id and sent[3] == history[3]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("beta", [False, True], ids=["parse", "beta-parse"])
def test_parse_with_a_pydantic_model(client: openai.OpenAI, chat_upstream: Upstream, model: str, beta: bool) -> None:
    completions = client.beta.chat.completions if beta else client.chat.completions
    answer = completions.parse(model=model, messages=MESSAGES, response_format=Forecast)
    parsed = answer.choices[0].message.parsed
    assert isinstance(parsed, Forecast)
    fmt = _sent(chat_upstream)["response_format"]
    # The SDK's strict schema reached the upstream as the SDK sent it.
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "Forecast"
    assert fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["schema"]["required"] == ["city", "temperature_c", "sunny", "hours"]
    assert parsed == Forecast.model_validate_json(answer.choices[0].message.content or "")
    assert parsed.hours == [len("hours")]


def test_stream_helper_with_a_pydantic_model(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(model="oa/gpt-4o-mini", messages=MESSAGES, response_format=Forecast) as s:
        kinds = {event.type for event in s}
        final = s.get_final_completion()
    assert "content.delta" in kinds and "content.done" in kinds
    assert isinstance(final.choices[0].message.parsed, Forecast)


@pytest.mark.parametrize("model", MODELS)
def test_logprobs_and_n(client: openai.OpenAI, chat_upstream: Upstream, chat_like: ChatLike, model: str) -> None:
    answer = client.chat.completions.create(
        model=model, messages=MESSAGES, n=2, logprobs=True, top_logprobs=2, max_tokens=6
    )
    sent = _sent(chat_upstream)
    assert (sent["n"], sent["logprobs"], sent["top_logprobs"]) == (2, True, 2)
    direct = chat_like.answer(sent)
    assert [c.index for c in answer.choices] == [0, 1]
    for got, want in zip(answer.choices, direct["choices"], strict=True):
        assert got.message.content == want["message"]["content"]
        assert got.logprobs is not None and got.logprobs.content is not None
        assert [t.model_dump() for t in got.logprobs.content] == want["logprobs"]["content"]

    streamed: dict[int, list[Any]] = {}
    for chunk in client.chat.completions.create(
        model=model, messages=MESSAGES, n=2, logprobs=True, top_logprobs=2, max_tokens=6, stream=True
    ):
        for c in chunk.choices:
            if c.logprobs is not None and c.logprobs.content:
                streamed.setdefault(c.index, []).extend(t.model_dump() for t in c.logprobs.content)
    assert streamed == {i: c["logprobs"]["content"] for i, c in enumerate(direct["choices"])}


@pytest.mark.parametrize("model", MODELS)
def test_parse_with_a_pydantic_function_tool(client: openai.OpenAI, chat_upstream: Upstream, model: str) -> None:
    answer = client.chat.completions.parse(
        model=model, messages=MESSAGES, tools=[openai.pydantic_function_tool(Forecast)]
    )
    (call,) = answer.choices[0].message.tool_calls or []
    assert isinstance(call.function.parsed_arguments, Forecast)
    (tool,) = _sent(chat_upstream)["tools"]
    assert tool["function"]["name"] == "Forecast" and tool["function"]["strict"] is True
    assert tool["function"]["parameters"]["additionalProperties"] is False


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("helper", ["create", "parse", "stream"])
def test_the_sdks_own_message_goes_back_as_it_came(
    client: openai.OpenAI, chat_upstream: Upstream, model: str, helper: str
) -> None:
    """The agent loop appends the message object the SDK returned, unchanged: from `parse` it carries `parsed`
    and each call's `parsed_arguments`, from the `stream` helper also `annotations`, `audio` and
    `function_call` (null) and each call's `index`. The gateway takes them and sends none upstream."""
    tools: Any = [openai.pydantic_function_tool(Forecast)] if helper == "parse" else [WEATHER_TOOL]
    if helper == "create":
        message: Any = client.chat.completions.create(model=model, messages=MESSAGES, tools=tools).choices[0].message
    elif helper == "parse":
        message = client.chat.completions.parse(model=model, messages=MESSAGES, tools=tools).choices[0].message
    else:
        with client.chat.completions.stream(model=model, messages=MESSAGES, tools=tools) as s:
            message = s.get_final_completion().choices[0].message
    (call,) = message.tool_calls or []
    if helper == "stream":
        assert call.index == 0 and "annotations" in message.model_fields_set  # what makes this case
    history = [*MESSAGES, message, {"role": "tool", "tool_call_id": call.id, "content": "21 degrees"}]
    second = client.chat.completions.create(model=model, messages=history, tools=tools)
    assert second.choices[0].message.content == " The tool said: 21 degrees"
    # Null fields are not written (the gateway's messages leave out what is unset), nor the SDK's own.
    assert _sent(chat_upstream)["messages"][2] == {
        "role": "assistant",
        "tool_calls": [
            {
                "type": "function",
                "id": call.id,
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
        ],
    }


def test_openais_own_service_fields_reach_openai_and_are_refused_by_name_elsewhere(
    client: openai.OpenAI, chat_upstream: Upstream
) -> None:
    fields: Any = {
        "store": True,
        "metadata": {"team": "search"},
        "service_tier": "flex",
        "prompt_cache_key": "conv-42",
        "safety_identifier": "user-7f3a",
    }
    client.chat.completions.create(model="oa/gpt-4o-mini", messages=MESSAGES, max_tokens=4, **fields)
    sent = _sent(chat_upstream)
    assert {k: sent[k] for k in fields} == fields
    # Storing nothing is what every server does: taken everywhere, and written nowhere.
    client.chat.completions.create(model="vc/Qwen/Qwen2.5-1.5B-Instruct", messages=MESSAGES, max_tokens=4, store=False)
    assert "store" not in _sent(chat_upstream)
    for name, value in fields.items():
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="vc/Qwen/Qwen2.5-1.5B-Instruct", messages=MESSAGES, max_tokens=4, **{name: value}
            )
        error: Any = refused.value.body
        assert (error["param"], error["code"]) == (name, "unsupported_parameter"), error
    # OpenAI's stream padding: the gateway's chunks carry none, whatever the client asks.
    stream = client.chat.completions.create(
        model="oa/gpt-4o-mini",
        messages=MESSAGES,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
    )
    assert list(stream)[-1].usage is not None
