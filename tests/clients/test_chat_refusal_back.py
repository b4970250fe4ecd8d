"""A refusal sent back, with the official `openai` SDK over real sockets: OpenAI answers a refused request with
`message.refusal` and no content; the agent loop appends that message, and the conversation's next turn goes
to a kind whose chat body is its own (anthropic, gemini, bedrock, cohere). The refusal is what the assistant
said in that turn, so it reaches those providers as the turn's text, not as an empty turn they refuse or a
turn with its words gone. The upstream answers each kind's recording (tests/fixtures/SOURCES.md).
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
  oa: {{kind: openai, base_url: {u}/v1, api_key: sk-upstream}}
  claude: {{kind: anthropic, base_url: {u}, api_key: sk-ant}}
  gem: {{kind: gemini, base_url: {u}/gemini, api_key: g-key}}
  co: {{kind: cohere, base_url: {u}/cohere, api_key: co-key}}
  br: {{kind: bedrock, base_url: {u}/bedrock, region: us-east-1, api_key: "AKIDEXAMPLE:secret"}}
"""
REFUSAL = fixture_json("openai/chat_refusal_docs.json")["choices"][0]["message"]["refusal"]
ANSWERS = {
    "/v1/chat/completions": "openai/chat_refusal_docs.json",
    "/v1/messages": "anthropic/messages_end_turn.json",
    "/cohere/v2/chat": "cohere/v2_chat_stop_sequence.json",
}


async def _handler(request: web.Request, received: Received) -> web.StreamResponse:
    path = received.path
    if path.startswith("/gemini/"):
        name = "gemini/generate_content_stop_sequence.json"
    elif path.startswith("/bedrock/"):
        name = "bedrock/converse_end_turn.json"
    else:
        name = ANSWERS[path]
    return web.Response(body=fixture_bytes(name), content_type="application/json")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = _handler
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chat-refusal"), CONFIG.format(u=upstream.url)) as gw:
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


def _assistant_turn(model: str, body: dict[str, Any]) -> Any:
    """The upstream body's turn for the assistant message, in the kind's own shape."""
    if model.startswith("gem/"):
        return [t for t in body["contents"] if t["role"] == "model"]
    return [t for t in body["messages"] if t["role"] == "assistant"]


@pytest.mark.parametrize(
    ("model", "want"),
    [
        ("claude/claude-3-5-sonnet-20240620", {"role": "assistant", "content": [{"type": "text", "text": REFUSAL}]}),
        ("gem/gemini-2.0-flash", {"role": "model", "parts": [{"text": REFUSAL}]}),
        ("br/anthropic.claude-3-haiku", {"role": "assistant", "content": [{"text": REFUSAL}]}),
        ("co/command-r", {"role": "assistant", "content": REFUSAL}),
    ],
)
def test_a_refusal_goes_back_as_the_turns_text(
    client: openai.OpenAI, received: list[Received], model: str, want: dict[str, Any]
) -> None:
    messages: list[Any] = [{"role": "user", "content": "How do I pick a lock?"}]
    refused = client.chat.completions.create(model="oa/gpt-4o-2024-08-06", messages=messages)
    said = refused.choices[0].message
    assert said.refusal == REFUSAL and said.content is None
    messages += [said, {"role": "user", "content": "Then tell me about locksmiths."}]
    answer = client.chat.completions.create(model=model, messages=messages)
    assert answer.choices[0].message.content
    assert _assistant_turn(model, received[-1].json()) == [want]


def test_a_refusal_part_goes_back_as_text(client: openai.OpenAI, received: list[Received]) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "How do I pick a lock?"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": REFUSAL}]},
        {"role": "user", "content": "Then tell me about locksmiths."},
    ]
    client.chat.completions.create(model="claude/claude-3-5-sonnet-20240620", messages=messages)
    (sent,) = received
    assert sent.json()["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": REFUSAL}]}
