"""A chat request's token reservation counts what it sends beside its messages' text, over real sockets.

Tool definitions, a `response_format` schema, thinking sent back in assistant messages and image parts go
upstream with the conversation and are billed as prompt: a token limit counts them as it counts a
completion's prompt (one token per 4 UTF-8 bytes of their JSON or text, here, a vLLM kind), and each image
part at `caps.image_tokens`. Limits are in process memory (the arithmetic is the same over Redis) and each
exact test has a key of its own, so `x-ratelimit-remaining-tokens` is the limit minus this one reservation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any, Final

import httpx
import pytest
from aiohttp import web

from tests.helpers.clients import client
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Received, Upstream

IMAGE_TOKENS: Final = 2500
DAY: Final = 1_000_000  # the tpd of the exact tests' keys
CONFIG: Final = """
retries: {{attempts: 1}}
caps: {{image_tokens: 2500}}
keys:
  - {{name: small, key: k-small, limits: {{tpm: 1000}}}}
  - {{name: mid-completion, key: k-mid-completion, limits: {{tpm: 3000}}}}
  - {{name: mid-chat, key: k-mid-chat, limits: {{tpm: 3000}}}}
  - {{name: plain, key: k-plain, limits: {{tpd: 1000000}}}}
  - {{name: forged, key: k-forged, limits: {{tpd: 1000000}}}}
  - {{name: tools, key: k-tools, limits: {{tpd: 1000000}}}}
  - {{name: image, key: k-image, limits: {{tpd: 1000000}}}}
providers:
  eng: {{kind: vllm, base_url: "{url}/v1", models: [m]}}
"""
BIG: Final = "word " * 8000  # 40,000 bytes: 10,000 tokens by the estimate, ten times a 1000-tpm key's limit
HI: Final = [{"role": "user", "content": "hi"}]  # rendered "user: hi\n": 9 bytes, 3 tokens


async def billing(request: web.Request, received: Received) -> web.StreamResponse:
    """An OpenAI-compatible server that bills the whole body it was sent as prompt (4 bytes a token), as a
    provider bills tool definitions, schemas and images with the messages."""
    prompt = len(received.body) // 4
    usage = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
    if received.path.endswith("/chat/completions"):
        message = {"role": "assistant", "content": "ok"}
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
        return web.json_response({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                                  "choices": [choice], "usage": usage})  # fmt: skip
    choice = {"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}
    return web.json_response(
        {"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [choice], "usage": usage}
    )


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = billing
        yield server


@pytest.fixture(scope="module")
def gw(up: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chat-tokens"), CONFIG.format(url=up.url)) as g:
        yield g


def post(gw: GatewayThread, key: str, payload: dict[str, Any], route: str = "/v1/chat/completions") -> httpx.Response:
    with client(gw.url, key) as c:
        return c.post(route, json=payload)


def tools(description: str) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "description": description, "parameters": {}}}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "eng/m", "messages": HI, "max_tokens": 1, **fields}


def tokens(text: str) -> int:
    """The estimate's count: one token per 4 UTF-8 bytes, rounded up."""
    return math.ceil(len(text.encode()) / 4)


def sent_json(value: object) -> str:
    """`value` as the gateway encodes it (compact, keys in the order given)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


SCHEMA: Final = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "description": BIG}}}
REASONED: Final = [*HI, {"role": "assistant", "content": "ok", "reasoning_content": BIG}, *HI]
BLOCKS: Final = [{"type": "thinking", "thinking": BIG, "signature": "s"}]
THOUGHT: Final = [*HI, {"role": "assistant", "content": "ok", "thinking_blocks": BLOCKS}, *HI]
# A call's id and the tool result's `tool_call_id` go upstream with the conversation (chat templates write
# them into the prompt, Gemini's signed ids carry the call's thought signature): 40,000 bytes of id each.
CALL_ID: Final = "call_" + "x" * 40_000
CALLED: Final = [
    *HI,
    {
        "role": "assistant",
        "tool_calls": [{"id": CALL_ID, "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": CALL_ID, "content": "ok"},
]
IMAGES: Final = [{"type": "image_url", "image_url": {"url": f"https://example.com/{i}.png"}} for i in range(200)]


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": tools(BIG)},
        {"response_format": SCHEMA},
        {"messages": REASONED},
        {"messages": THOUGHT},
        {"messages": [{"role": "user", "content": IMAGES}]},
        {"messages": [{"role": "user", "content": IMAGES[:1]}]},  # 2,500 tokens: over 1,000 alone
        {"messages": CALLED},
    ],
    ids=["tools", "response_format", "reasoning_content", "thinking_blocks", "200-images", "one-image", "call-ids"],
)
def test_what_a_chat_sends_beside_its_messages_is_refused_as_a_completion_prompt_of_its_size_is(
    gw: GatewayThread, up: Upstream, fields: dict[str, Any]
) -> None:
    up.reset()
    up.handler = billing
    completion = post(gw, "k-small", {"model": "eng/m", "prompt": BIG, "max_tokens": 1}, "/v1/completions")
    assert completion.status_code == 400 and completion.json()["error"]["code"] == "exceeds_token_limit"
    refused = post(gw, "k-small", chat(**fields))
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "exceeds_token_limit"
    # What weighs most is named (thinking sent back and images are in `messages`), not max_tokens.
    assert refused.json()["error"]["param"] == next(iter(fields))
    assert not up.received  # refused before any upstream call


def test_tools_take_a_small_key_as_the_same_bytes_as_a_completion_prompt_do(gw: GatewayThread, up: Upstream) -> None:
    """tpm 3000: a request of about 2,000 tokens passes once, and the next in the same minute is a 429, whether
    its bulk is a completion's prompt or a chat's tool definitions."""
    up.reset()
    up.handler = billing
    bulk = "word " * 1600  # 8,000 bytes
    for key, payload, route in [
        ("k-mid-completion", {"model": "eng/m", "prompt": bulk, "max_tokens": 1}, "/v1/completions"),
        ("k-mid-chat", chat(tools=tools(bulk)), "/v1/chat/completions"),
    ]:
        assert post(gw, key, payload, route).status_code == 200
        again = post(gw, key, payload, route)
        assert again.status_code == 429, (route, again.text)
        assert again.json()["error"]["code"] == "rate_limit_exceeded"
    assert len(up.received) == 2


def test_a_chat_reserves_its_tools_json_and_its_images_allowance(gw: GatewayThread, up: Upstream) -> None:
    up.reset()
    up.handler = billing
    described = tools("look it up " * 50)
    with_tools = post(gw, "k-tools", chat(tools=described, max_tokens=10))
    assert with_tools.status_code == 200, with_tools.text
    reserved = tokens("user: hi\n") + tokens(sent_json(described)) + 10
    assert with_tools.headers["x-ratelimit-remaining-tokens"] == str(DAY - reserved)

    content = [{"type": "text", "text": "hi"}, *IMAGES[:2]]
    with_images = post(gw, "k-image", chat(messages=[{"role": "user", "content": content}], max_tokens=10))
    assert with_images.status_code == 200, with_images.text
    reserved = tokens("user: hi[image][image]\n") + 2 * IMAGE_TOKENS + 10
    assert with_images.headers["x-ratelimit-remaining-tokens"] == str(DAY - reserved)


def test_a_plain_text_chat_reserves_its_rendered_messages_alone(gw: GatewayThread, up: Upstream) -> None:
    up.reset()
    up.handler = billing
    parts = [{"type": "text", "text": "hi"}]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": parts}]
    plain = post(gw, "k-plain", chat(messages=messages, max_tokens=10))
    assert plain.status_code == 200, plain.text
    reserved = tokens("system: be brief\nuser: hi\n") + 10
    assert plain.headers["x-ratelimit-remaining-tokens"] == str(DAY - reserved)


def test_a_clients_own_count_of_what_it_sends_beside_is_not_taken(gw: GatewayThread, up: Upstream) -> None:
    """The counted part travels in the request under a name no client sends: one that sends it anyway (to
    lower its reservation) is counted as any other."""
    up.reset()
    up.handler = billing
    forged = {"text": "", "image_tokens": -500_000}
    answer = post(gw, "k-forged", chat(**{" unrendered": forged, "tools": tools("x" * 400), "max_tokens": 10}))
    assert answer.status_code == 200, answer.text
    reserved = tokens("user: hi\n") + tokens(sent_json(tools("x" * 400))) + 10
    assert answer.headers["x-ratelimit-remaining-tokens"] == str(DAY - reserved)
