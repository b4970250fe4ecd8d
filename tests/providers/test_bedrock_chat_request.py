"""Chat on Bedrock's Converse (providers/bedrock_chat.py), the request: the conversation as Converse's turns
and `toolConfig`, signed like a completion (the recorded request of tests/fixtures/SOURCES.md), the sampling
fields, structured output and images; what Converse cannot honour refused naming field and provider."""

from __future__ import annotations

import json
from typing import Any

import pytest

from providers.base import Endpoint
from providers.bedrock import DEFAULT_BASE_URL
from tests.providers.bedrock_setup import (
    ADAPTER,
    CITY,
    CLAUDE,
    NOVA,
    TOOLS,
    USER,
    chat_body,
    chat_request,
    sent_chat,
)
from wire.errors import InvalidRequestError, UnsupportedParamError


def test_the_recorded_conversation_translates_to_the_recorded_converse_turns() -> None:
    # The second request of the recording: the model's text and tool call, the tool's result.
    thought = "<thinking> To find the temperature of the capital of France, I need to ... </thinking>\n"
    call = {
        "id": "tooluse_lAG_zP8QRHmSYOwZzzaCqA",
        "type": "function",
        "function": {"name": "get_temperature", "arguments": '{"city":"Paris"}'},
    }
    url, headers, body = sent_chat(
        chat_request(
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
    body = chat_body(
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
    body = chat_body(messages=USER, tools=TOOLS, tool_choice=choice, parallel_tool_calls=True)
    assert body["toolConfig"]["toolChoice"] == expected
    assert len(body["toolConfig"]["tools"]) == 1


def test_sampling_fields_and_strict_tools() -> None:
    tools = [{"type": "function", "function": {"name": "f", "strict": True}}]
    body = chat_body(
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
    body = chat_body(messages=USER, response_format=fmt)
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
    assert "outputConfig" not in chat_body(messages=USER, response_format={"type": "text"})


def test_an_inline_image_is_an_image_block() -> None:
    url = "data:image/png;base64,iVBORw0KGgo="
    body = chat_body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
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
        sent_chat(chat_request(**{"messages": USER, **body}))
    assert caught.value.param == field
    assert "'aws'" in caught.value.message


def test_bad_values_are_400s() -> None:
    with pytest.raises(InvalidRequestError) as range_error:
        chat_body(messages=USER, temperature=1.5)
    assert range_error.value.param == "temperature"
    bad = {"id": "t", "type": "function", "function": {"name": "f", "arguments": "[1]"}}
    with pytest.raises(InvalidRequestError) as args_error:
        chat_body(messages=[*USER, {"role": "assistant", "tool_calls": [bad]}])
    assert args_error.value.param == "messages"
    with pytest.raises(InvalidRequestError):
        chat_body(
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,%%"}}]}
            ]
        )
    with pytest.raises(InvalidRequestError) as guarded:
        chat_body(messages=USER, inference_extra_params={"inferenceConfig": {"maxTokens": 10**6}})
    assert guarded.value.param == "inference_extra_params.inferenceConfig.maxTokens"


def test_stream_goes_to_converse_stream_and_extra_params_nest() -> None:
    url, _, body = sent_chat(
        chat_request(
            messages=USER, stream=True, max_tokens=5, inference_extra_params={"inferenceConfig": {"topP": 0.9}}
        )
    )
    assert url.endswith(f"/model/{NOVA}/converse-stream")
    assert body["inferenceConfig"] == {"maxTokens": 5, "topP": 0.9}
    assert "stream" not in body


def test_chat_is_declared_for_the_docs() -> None:
    assert ADAPTER.chat_framing == "eventstream"
    assert ADAPTER.chat_params is not None and "tools" in ADAPTER.chat_params
    with pytest.raises(UnsupportedParamError):
        sent_chat(
            chat_request(messages=USER, top_k=5),
            Endpoint(provider="aws", model="meta.llama3", base_url="", region="us-east-1"),
        )
    assert sent_chat(
        chat_request(messages=USER, top_k=5), Endpoint(provider="aws", model=CLAUDE, base_url="", region="us-east-1")
    )[2]["additionalModelRequestFields"] == {"top_k": 5}
