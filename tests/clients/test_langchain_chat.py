"""LangChain's `ChatOpenAI` (langchain-openai) pointed at the gateway's `/v1/chat/completions`, unmodified:
invoke, stream, `bind_tools` (plain, streamed, and the tool's result sent back), `with_structured_output`
with a Pydantic model (its default `json_schema` method and `function_calling`), over real sockets.

The upstream is `ChatLike` (chatlike.py) behind providers of kind openai (`oa`) and vllm (`vc`); each answer
is compared with what that upstream answers the body the gateway sent it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, SecretStr

from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream

from .chatlike import ChatLike, instance
from .conftest import CLIENTS_KEY

MODELS = [pytest.param("oa/gpt-4o-mini", id="openai"), pytest.param("vc/Qwen/Qwen2.5-1.5B-Instruct", id="vllm")]
MESSAGES = [SystemMessage("Answer briefly."), HumanMessage("What is 2 + 2?")]


class Forecast(BaseModel):
    """A city's forecast."""

    city: str
    temperature_c: float
    sunny: bool


@tool
def get_weather(city: str, unit: str) -> str:
    """The weather in a city, in a unit."""
    return f"21 {unit} in {city}"


@pytest.fixture
def http_client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=15) as client:
        yield client


def _chat(gateway: GatewayThread, http_client: httpx.Client, model: str, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=model,
        base_url=gateway.url + "/v1",
        api_key=SecretStr(CLIENTS_KEY),
        max_retries=0,
        http_client=http_client,
        **kwargs,
    )


def _sent(upstream: Upstream) -> dict[str, Any]:
    body: dict[str, Any] = upstream.received[-1].json()
    return body


@pytest.mark.parametrize("model", MODELS)
def test_invoke_and_stream(
    gateway: GatewayThread, http_client: httpx.Client, chat_upstream: Upstream, chat_like: ChatLike, model: str
) -> None:
    llm = _chat(gateway, http_client, model, temperature=0, max_tokens=9, stream_usage=True)
    answer = llm.invoke(MESSAGES)
    direct = chat_like.answer(_sent(chat_upstream))
    assert isinstance(answer, AIMessage) and answer.content == direct["choices"][0]["message"]["content"]
    assert answer.response_metadata["finish_reason"] == direct["choices"][0]["finish_reason"]
    assert answer.response_metadata["model_name"] == model
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["total_tokens"] == direct["usage"]["total_tokens"]

    pieces = list(llm.stream(MESSAGES))
    assert len(pieces) > 2
    joined = pieces[0]
    for piece in pieces[1:]:
        joined += piece
    assert isinstance(joined, AIMessageChunk)
    assert joined.content == answer.content
    assert joined.usage_metadata is not None
    assert joined.usage_metadata["total_tokens"] == direct["usage"]["total_tokens"]
    assert _sent(chat_upstream)["stream"] is True


@pytest.mark.parametrize("model", MODELS)
def test_bind_tools_invoke_stream_and_answer(
    gateway: GatewayThread, http_client: httpx.Client, chat_upstream: Upstream, model: str
) -> None:
    llm = _chat(gateway, http_client, model).bind_tools([get_weather])
    answer = llm.invoke(MESSAGES)
    assert isinstance(answer, AIMessage)
    sent = _sent(chat_upstream)
    (schema,) = sent["tools"]
    assert schema["function"]["name"] == "get_weather"
    want = instance(schema["function"]["parameters"])
    (call,) = answer.tool_calls
    assert (call["name"], call["args"]) == ("get_weather", want)
    assert answer.response_metadata["finish_reason"] == "tool_calls"

    joined: Any = None
    for piece in llm.stream(MESSAGES):
        joined = piece if joined is None else joined + piece
    assert isinstance(joined, AIMessageChunk)
    assert [(c["id"], c["name"], c["args"]) for c in joined.tool_calls] == [(call["id"], "get_weather", want)]
    assert len(joined.tool_call_chunks) == 1

    # The agent's next turn: the call as LangChain holds it, then the tool's result.
    result = get_weather.invoke(call)
    assert isinstance(result, ToolMessage)
    final = llm.invoke([*MESSAGES, answer, result])
    assert final.content == f" The tool said: {result.content}"
    messages = _sent(chat_upstream)["messages"]
    assert messages[2]["role"] == "assistant" and messages[2]["tool_calls"][0]["id"] == call["id"]
    assert messages[3] == {"role": "tool", "tool_call_id": call["id"], "content": result.content}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output(
    gateway: GatewayThread, http_client: httpx.Client, chat_upstream: Upstream, model: str, method: str
) -> None:
    structured = _chat(gateway, http_client, model).with_structured_output(Forecast, method=method)  # type: ignore[arg-type]
    out = structured.invoke(MESSAGES)
    assert isinstance(out, Forecast)
    sent = _sent(chat_upstream)
    if method == "json_schema":
        schema = sent["response_format"]["json_schema"]
        assert sent["response_format"]["type"] == "json_schema" and schema["name"] == "Forecast"
    else:
        (fn,) = sent["tools"]
        schema = fn["function"]
        assert schema["name"] == "Forecast"
        assert sent["tool_choice"]["function"]["name"] == "Forecast"
    assert out == Forecast.model_validate(instance(schema.get("schema") or schema["parameters"]))


# LangChain dumps the SDK's parsed stream snapshots with `model_dump()`, whose declared `parsed: None` meets a
# parsed Forecast: Pydantic warns in the client, whatever server answered.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
def test_structured_output_streamed(gateway: GatewayThread, http_client: httpx.Client) -> None:
    structured = _chat(gateway, http_client, "oa/gpt-4o-mini").with_structured_output(Forecast)
    parts = list(structured.stream(MESSAGES))
    assert parts and isinstance(parts[-1], Forecast)
