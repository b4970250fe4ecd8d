"""A message's `name` and an assistant message's `refusal` on the OpenAI-wire kinds, with the official `openai`
SDK over real sockets: each route gets them only as its server's request schema has them.

- `name`: sent as it is where the server reads it (openai, vllm, llamacpp, deepseek, fireworks; sglang on
  system, developer and assistant messages; together on system, user and assistant ones). Where it does
  not (mistral answers 422 to it, ollama and tgi drop it unread, sglang a user message's, pais's messages
  have none), a named message is a 400 `unsupported_parameter` naming `messages.name`, the message's index
  and the provider, before any call; with `unsupported_params: drop` the names are left out and listed in
  `x-gateway-dropped-params`.
- `refusal`: OpenAI's own field goes to openai as it is; every other route gets the refusal as the
  assistant turn's text (the field and `refusal` parts), as the kinds with their own bodies do.

The upstream answers each route with a chat recording (tests/fixtures/SOURCES.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from aiohttp import web

from tests.helpers.clients import openai_client
from tests.helpers.recordings import fixture_bytes, fixture_json
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
unsupported_params: error
retries: {{attempts: 1}}
providers:
  oa: {{kind: openai, base_url: {u}/oa/v1, api_key: sk-upstream}}
  mis: {{kind: mistral, base_url: {u}/mis, api_key: m-key}}
  mis-drop: {{kind: mistral, base_url: {u}/mis, api_key: m-key, unsupported_params: drop}}
  oll: {{kind: ollama, base_url: {u}/oll, discover: false, models: [m]}}
  tgi: {{kind: tgi, base_url: {u}/tgi, discover: false, models: [m]}}
  vl: {{kind: vllm, base_url: {u}/vl/v1, discover: false, models: [m]}}
  sg: {{kind: sglang, base_url: {u}/sg/v1, discover: false, models: [m]}}
  lc: {{kind: llamacpp, base_url: {u}/lc, discover: false, models: [m]}}
  tog: {{kind: together, base_url: {u}/tog/v1, api_key: t-key}}
  ds: {{kind: deepseek, base_url: {u}/ds, api_key: d-key}}
  fw: {{kind: fireworks, base_url: {u}/fw/inference/v1, api_key: f-key}}
  pa: {{kind: pais, base_url: {u}/pa/api/v1/compatibility/openai/v1}}
"""
REFUSAL = fixture_json("openai/chat_refusal_docs.json")["choices"][0]["message"]["refusal"]
NAMED: list[Any] = [
    {"role": "system", "content": "Answer briefly.", "name": "rules"},
    {"role": "user", "content": "Tell me a joke", "name": "alice"},
]
REFUSED: list[Any] = [
    {"role": "user", "content": "How do I pick a lock?"},
    {"role": "assistant", "content": None, "refusal": REFUSAL},
    {"role": "user", "content": "Then tell me about locksmiths."},
]


async def _handler(request: web.Request, received: Received) -> web.StreamResponse:
    if received.json().get("stream"):
        body = fixture_bytes("fireworks/chat_stream_via_hf_router.sse.txt")  # OpenAI's chunks, usage on the last
        return web.Response(body=body, content_type="text/event-stream")
    name = (
        "mistral/chat_with_ratelimit_headers.json"
        if received.path.startswith("/mis/")
        else "openai/chat_completion.json"
    )
    return web.Response(body=fixture_bytes(name), content_type="application/json")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = _handler
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chat-fields"), CONFIG.format(u=upstream.url)) as gw:
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


def _sent(received: list[Received]) -> list[Any]:
    (sent,) = [r for r in received if r.path.endswith("/chat/completions")]
    return list(sent.json()["messages"])


@pytest.mark.parametrize(
    "model", ["oa/gpt-4o-mini", "vl/m", "lc/m", "ds/deepseek-chat", "fw/accounts/fireworks/models/m", "tog/m"]
)
def test_routes_that_read_the_names_get_them(client: openai.OpenAI, received: list[Received], model: str) -> None:
    client.chat.completions.create(model=model, messages=NAMED)
    assert _sent(received) == NAMED


def test_sglang_gets_the_names_of_the_roles_it_reads(client: openai.OpenAI, received: list[Received]) -> None:
    named = [
        NAMED[0],
        {"role": "user", "content": "Tell me a joke"},
        {"role": "assistant", "content": "Hi", "name": "bot"},
    ]
    client.chat.completions.create(model="sg/m", messages=named)
    assert _sent(received) == named


@pytest.mark.parametrize(
    ("model", "messages", "at", "role"),
    [
        ("mis/mistral-small-latest", NAMED, 0, "system"),
        ("oll/m", NAMED, 0, "system"),
        ("tgi/m", NAMED, 0, "system"),
        ("pa/m", NAMED, 0, "system"),
        ("sg/m", NAMED, 1, "user"),
        ("tog/m", [{"role": "developer", "content": "Be brief.", "name": "rules"}, NAMED[1]], 0, "developer"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_routes_without_them_refuse_a_named_message(
    client: openai.OpenAI,
    received: list[Received],
    model: str,
    messages: list[Any],
    at: int,
    role: str,
    stream: bool,
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=messages, stream=stream)
    body: Any = caught.value.body
    assert body["param"] == "messages.name" and body["code"] == "unsupported_parameter", body
    assert f"'{model.split('/')[0]}'" in body["message"] and f"messages[{at}].name" in body["message"], body
    assert f"{role} message" in body["message"], body
    assert received == []


def test_drop_leaves_the_names_out_and_lists_them(client: openai.OpenAI, received: list[Received]) -> None:
    raw = client.chat.completions.with_raw_response.create(model="mis-drop/mistral-small-latest", messages=NAMED)
    assert raw.headers["x-gateway-dropped-params"] == "messages.name"
    assert raw.parse().choices[0].message.content
    assert _sent(received) == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Tell me a joke"},
    ]


def test_openai_gets_its_refusal_as_it_is(client: openai.OpenAI, received: list[Received]) -> None:
    client.chat.completions.create(model="oa/gpt-4o-mini", messages=REFUSED)
    assert _sent(received)[1] == {"role": "assistant", "refusal": REFUSAL}


@pytest.mark.parametrize(
    "model", ["mis/mistral-small-latest", "oll/m", "tgi/m", "vl/m", "sg/m", "lc/m", "tog/m", "ds/deepseek-chat"]
)
@pytest.mark.parametrize("stream", [False, True])
def test_other_routes_get_the_refusal_as_the_turns_text(
    client: openai.OpenAI, received: list[Received], model: str, stream: bool
) -> None:
    if stream:
        for _ in client.chat.completions.create(model=model, messages=REFUSED, stream=True):
            pass
    else:
        client.chat.completions.create(model=model, messages=REFUSED)
    assert _sent(received)[1] == {"role": "assistant", "content": REFUSAL}


def test_refusal_parts_go_as_text(client: openai.OpenAI, received: list[Received]) -> None:
    parts: list[Any] = [{"type": "text", "text": "Sorry: "}, {"type": "refusal", "refusal": REFUSAL}]
    messages = [REFUSED[0], {"role": "assistant", "content": parts}, REFUSED[2]]
    client.chat.completions.create(model="mis/mistral-small-latest", messages=messages)
    assert _sent(received)[1] == {"role": "assistant", "content": "Sorry: " + REFUSAL}
    client.chat.completions.create(model="oa/gpt-4o-mini", messages=messages)
    assert _sent(received[1:])[1] == {"role": "assistant", "content": parts}
