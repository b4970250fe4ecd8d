"""A message's `name` on chat, with the official `openai` SDK over real sockets: the OpenAI-wire kinds send it
as it is; the kinds whose chat body is their own (anthropic, gemini, bedrock, cohere) have no field for it,
so it is refused by name (`messages.name`) before any upstream call, or dropped and listed in
`x-gateway-dropped-params` under `unsupported_params: drop`, as any other field such a route lacks. An alias
whose first target refuses it moves on to a target that takes it. The upstream answers each kind's recording
(tests/fixtures/SOURCES.md).
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
  oa: {{kind: openai, base_url: {u}/v1, api_key: sk-upstream}}
  hosted: {{kind: vllm, base_url: {u}/v1, discover: false, models: [m]}}
  claude: {{kind: anthropic, base_url: {u}, api_key: sk-ant}}
  claude-drop: {{kind: anthropic, base_url: {u}, api_key: sk-ant, unsupported_params: drop}}
  gem: {{kind: gemini, base_url: {u}/gemini, api_key: g-key}}
  co: {{kind: cohere, base_url: {u}/cohere, api_key: co-key}}
  br: {{kind: bedrock, base_url: {u}/bedrock, region: us-east-1, api_key: "AKIDEXAMPLE:secret"}}
models:
  - name: claude-first
    strategy: ordered
    targets: [{{model: claude/claude-3-5-sonnet-20240620}}, {{model: oa/gpt-4o-mini}}]
"""
NAMED: list[Any] = [
    {"role": "system", "content": "Answer briefly.", "name": "rules"},
    {"role": "user", "content": "Tell me a joke", "name": "alice"},
]


async def _handler(request: web.Request, received: Received) -> web.StreamResponse:
    name = "anthropic/messages_end_turn.json" if received.path == "/v1/messages" else "openai/chat_completion.json"
    return web.Response(body=fixture_bytes(name), content_type="application/json")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = _handler
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chat-names"), CONFIG.format(u=upstream.url)) as gw:
        yield gw


@pytest.fixture
def received(upstream: Upstream) -> Iterator[list[Received]]:
    upstream.received = []
    yield upstream.received


@pytest.fixture(scope="module")
def client(gateway: GatewayThread) -> Iterator[openai.OpenAI]:
    sdk = openai_client(gateway.url + "/v1", "unused")
    yield sdk
    sdk.close()


@pytest.mark.parametrize("model", ["oa/gpt-4o-mini", "hosted/m"])
def test_openai_wire_kinds_send_the_names(client: openai.OpenAI, received: list[Received], model: str) -> None:
    client.chat.completions.create(model=model, messages=NAMED)
    (sent,) = received
    assert sent.json()["messages"] == NAMED


@pytest.mark.parametrize(
    "model",
    ["claude/claude-3-5-sonnet-20240620", "gem/gemini-2.0-flash", "co/command-r", "br/anthropic.claude-3-haiku"],
)
def test_kinds_without_names_refuse_them(client: openai.OpenAI, received: list[Received], model: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=NAMED)
    body: Any = caught.value.body
    assert body["param"] == "messages.name" and body["code"] == "unsupported_parameter", body
    assert f"'{model.split('/')[0]}'" in body["message"], body
    assert received == []


@pytest.mark.parametrize("extra", [{"stream": True}, {"n": 2}, {"n": 2, "stream": True}])
def test_streams_and_fanned_out_choices_refuse_them_too(
    client: openai.OpenAI, received: list[Received], extra: dict[str, Any]
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="claude/claude-3-5-sonnet-20240620", messages=NAMED, **extra)
    body: Any = caught.value.body
    assert body["param"] == "messages.name" and body["code"] == "unsupported_parameter", body
    assert received == []


def test_an_unnamed_conversation_reaches_them(client: openai.OpenAI, received: list[Received]) -> None:
    answer = client.chat.completions.create(
        model="claude/claude-3-5-sonnet-20240620", messages=[{"role": "user", "content": "Tell me a joke"}]
    )
    assert answer.choices[0].message.content and len(received) == 1


def test_dropped_and_listed_under_drop(client: openai.OpenAI, received: list[Received]) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="claude-drop/claude-3-5-sonnet-20240620", messages=NAMED
    )
    assert raw.headers["x-gateway-dropped-params"] == "messages.name"
    assert raw.parse().choices[0].message.content
    (sent,) = received
    assert sent.json()["system"] == "Answer briefly."
    assert sent.json()["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Tell me a joke"}]}]


def test_an_alias_moves_on_to_a_target_that_takes_them(client: openai.OpenAI, received: list[Received]) -> None:
    answer = client.chat.completions.create(model="claude-first", messages=NAMED)
    assert answer.choices[0].message.content
    (sent,) = received
    assert sent.path == "/v1/chat/completions" and sent.json()["messages"] == NAMED
