"""A function's `strict: true` on the kinds that write tools their own way, with the official `openai` SDK
over real sockets: Anthropic gets it on the tool (its strict tool use), Cohere as `strict_tools` when every
function asks it, and where the provider's body cannot carry it (Gemini, Cohere's mixed request) it is never
left out unsaid: a 400 naming `tools.function.strict` under `unsupported_params: error`, or the call made
without it and `tools.function.strict` listed in `x-gateway-dropped-params` under `drop`.

The loopback upstream answers each kind's recorded tool-call answer (tests/fixtures/SOURCES.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from aiohttp import web

from tests.helpers.clients import openai_client
from tests.helpers.recordings import fixture_bytes
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
retries: {{attempts: 1}}
providers:
  claude: {{kind: anthropic, base_url: {u}/anthropic, api_key: sk-ant}}
  gem: {{kind: gemini, base_url: {u}/gemini, api_key: g-key}}
  gemdrop: {{kind: gemini, base_url: {u}/gemini, api_key: g-key, unsupported_params: drop}}
  co: {{kind: cohere, base_url: {u}/cohere, api_key: co-key}}
  codrop: {{kind: cohere, base_url: {u}/cohere, api_key: co-key, unsupported_params: drop}}
"""
WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string"}},
        "required": ["location"],
        "additionalProperties": False,
    },
}
MESSAGES: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
ANSWERS = {
    "anthropic": "anthropic/messages_tool_use.json",
    "gemini": "gemini/generate_content_function_args.json",
    "cohere": "cohere/v2_chat_tool_call.json",
}


async def _recorded(request: web.Request, received: Received) -> web.StreamResponse:
    name = ANSWERS[received.path.split("/")[1]]
    return web.Response(body=fixture_bytes(name), content_type="application/json")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = _recorded
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("strict-tools"), CONFIG.format(u=upstream.url)) as gw:
        yield gw


@pytest.fixture
def client(gateway: GatewayThread, upstream: Upstream) -> Iterator[openai.OpenAI]:
    upstream.reset()
    upstream.handler = _recorded
    with openai_client(gateway.url + "/v1", "unused") as sdk:
        yield sdk


def _tools(*strict: bool | None) -> list[Any]:
    out = []
    for i, flag in enumerate(strict):
        function = {**WEATHER, "name": f"get_weather_{i}"}
        if flag is not None:
            function["strict"] = flag
        out.append({"type": "function", "function": function})
    return out


def _ask(client: openai.OpenAI, model: str, tools: list[Any]) -> Any:
    return client.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, tools=tools)


def test_anthropic_gets_strict_on_each_tool_that_asks_it(client: openai.OpenAI, upstream: Upstream) -> None:
    raw = _ask(client, "claude/claude-sonnet-4-5", _tools(True, None))
    assert raw.parse().choices[0].message.tool_calls
    assert "x-gateway-dropped-params" not in raw.headers
    sent = upstream.only().json()["tools"]
    assert [t.get("strict") for t in sent] == [True, None], sent
    assert sent[0]["input_schema"] == WEATHER["parameters"]


def test_cohere_gets_strict_tools_when_every_function_asks_it(client: openai.OpenAI, upstream: Upstream) -> None:
    raw = _ask(client, "co/command-r-plus", _tools(True, True))
    assert raw.parse().choices[0].message.tool_calls
    assert "x-gateway-dropped-params" not in raw.headers
    body = upstream.only().json()
    assert body["strict_tools"] is True
    assert all("strict" not in t["function"] for t in body["tools"]), body["tools"]
    upstream.reset()
    upstream.handler = _recorded
    _ask(client, "co/command-r-plus", _tools(False, None))  # nothing asked: nothing sent, nothing refused
    assert "strict_tools" not in upstream.only().json()


@pytest.mark.parametrize(("model", "strict"), [("gem/gemini-2.0-flash", (True,)), ("co/command-r-plus", (True, False))])
def test_strict_a_provider_cannot_carry_is_a_400_naming_it(
    client: openai.OpenAI, upstream: Upstream, model: str, strict: tuple[bool, ...]
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(client, model, _tools(*strict))
    body: Any = caught.value.body
    assert body["param"] == "tools.function.strict" and body["code"] == "unsupported_parameter", body
    assert upstream.received == []


@pytest.mark.parametrize(
    ("model", "strict"), [("gemdrop/gemini-2.0-flash", (True,)), ("codrop/command-r-plus", (True, False))]
)
def test_strict_dropped_under_drop_is_listed_in_the_dropped_params_header(
    client: openai.OpenAI, upstream: Upstream, model: str, strict: tuple[bool, ...]
) -> None:
    raw = _ask(client, model, _tools(*strict))
    assert raw.parse().choices[0].message.tool_calls
    assert raw.headers["x-gateway-dropped-params"] == "tools.function.strict"
    body = upstream.only().json()
    assert "strict" not in str(body), body
