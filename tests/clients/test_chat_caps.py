"""The caps on a chat request's conversation, and which message a refusal names, over real sockets: how
many messages it may send and how many content parts they may hold together (`caps.chat_messages`,
`caps.chat_content_parts`). Beyond either, the `openai` SDK gets a 400 naming the field before any upstream
is asked; at the cap the request is served. A conversation the body cap lets through (8 MiB holds some
290,000 one-word messages) would otherwise be walked, rendered, counted and translated message by message
on the gateway's event loop.

A malformed message is a 400 whose `param` is the field's path (`messages.content`) and whose message names
the message by its index (`messages[2].content`), so a client finds it in a long conversation.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.config import CapsConfig
from tests.helpers.clients import openai_client
from tests.helpers.recordings import fixture_bytes
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream, reply

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
caps: {{chat_messages: 6, chat_content_parts: 5, json_depth: 6}}
providers:
  oa: {{kind: openai, base_url: {u}/v1, api_key: sk-upstream}}
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as u:
        yield u


@pytest.fixture(scope="module")
def gw(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chat-caps"), CONFIG.format(u=upstream.url)) as g:
        yield g


@pytest.fixture
def client(gw: GatewayThread, upstream: Upstream) -> Iterator[openai.OpenAI]:
    upstream.reset()
    upstream.handler = reply(fixture_bytes("openai/chat_completion.json"))
    with openai_client(gw.url + "/v1", "unused") as c:
        yield c


def _turns(count: int) -> list[Any]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(count)]


def _refused(client: openai.OpenAI, messages: list[Any]) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="oa/gpt-4o-mini", messages=messages)
    return caught.value


def test_at_the_caps_the_conversation_is_served(client: openai.OpenAI, upstream: Upstream) -> None:
    parts: list[Any] = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}
    messages = [
        *_turns(3),
        {"role": "user", "content": [*parts, image]},
        *_turns(1),
        {"role": "system", "content": parts},
    ]
    answer = client.chat.completions.create(model="oa/gpt-4o-mini", messages=messages)
    assert answer.choices[0].message.content
    assert len(upstream.only().json()["messages"]) == 6


def test_more_messages_than_the_cap_is_a_400_naming_messages(client: openai.OpenAI, upstream: Upstream) -> None:
    err = _refused(client, _turns(7))
    body: Any = err.body
    assert err.status_code == 400 and body["param"] == "messages" and body["code"] == "invalid_value", body
    assert "7 messages" in body["message"] and "at most 6" in body["message"], body
    assert upstream.received == []


def test_more_content_parts_than_the_cap_is_a_400_naming_the_message(client: openai.OpenAI, upstream: Upstream) -> None:
    # Three parts, then three more: the sixth part, in the second list (messages[2]), passes the cap of five.
    three: list[Any] = [{"type": "text", "text": "x"}] * 3
    messages = [
        {"role": "user", "content": three},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": three},
    ]
    err = _refused(client, messages)
    body: Any = err.body
    assert err.status_code == 400 and body["param"] == "messages.content" and body["code"] == "invalid_value", body
    assert "messages[2].content" in body["message"] and "at most 5" in body["message"], body
    assert upstream.received == []


def test_the_defaults_are_documented_bounds() -> None:
    caps = CapsConfig()
    assert (caps.chat_messages, caps.chat_content_parts) == (10_000, 10_000)
    security = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    assert "| `caps.chat_messages` | 10,000 |" in security
    assert "| `caps.chat_content_parts` | 10,000 |" in security


@pytest.mark.parametrize(
    "bad,param,where",
    [
        ({"role": "user", "content": 5}, "messages.content", "'messages[2].content'"),
        ({"role": "user", "content": [["nested"]]}, "messages.content", "'messages[2].content[0]'"),
        ({"role": "robot", "content": "x"}, "messages.role", "'messages[2].role'"),
        ({"role": "tool", "content": "x"}, "messages.tool_call_id", "'messages[2].tool_call_id'"),
        (
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            "messages.tool_calls.id",
            "'messages[2].tool_calls[0].id'",
        ),
        # OpenAI's rule: an assistant message's content is required unless it calls tools (or refuses).
        ({"role": "assistant"}, "messages.content", "'messages[2].content'"),
        ({"role": "assistant", "content": None}, "messages.content", "'messages[2].content'"),
    ],
)
def test_a_malformed_message_is_named_by_its_index(
    client: openai.OpenAI, upstream: Upstream, bad: dict[str, Any], param: str, where: str
) -> None:
    err = _refused(client, [*_turns(2), bad])
    body: Any = err.body
    assert err.status_code == 400 and body["param"] == param, body
    assert where in body["message"], body
    assert upstream.received == []


def test_a_parsed_answer_sent_back_nested_past_json_depth_is_a_400_naming_it(
    client: openai.OpenAI, upstream: Upstream
) -> None:
    # What the SDK's `parse` helper puts on the message it returns, sent back as it came: free-form JSON the
    # client controls, held to caps.json_depth like any other before it is cleared.
    deep: Any = {}
    for _ in range(6):
        deep = {"a": deep}
    answer: Any = {"role": "assistant", "content": "{}", "parsed": deep, "annotations": []}
    err = _refused(client, [{"role": "user", "content": "Hi"}, answer])
    body: Any = err.body
    assert err.status_code == 400 and body["param"] == "messages.parsed", body
    assert body["code"] == "too_deeply_nested" and "'messages[1].parsed'" in body["message"], body
    assert upstream.received == []
    answer["parsed"] = deep["a"]  # at the cap: taken, and no upstream sees it
    client.chat.completions.create(model="oa/gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}, answer])
    assert set(upstream.only().json()["messages"][1]) == {"role", "content"}
