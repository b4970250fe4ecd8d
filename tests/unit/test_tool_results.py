"""Tool results paired with their calls: which tool message normalize_chat finds answering no call of its turn,
which turn it finds with a call left unanswered, which result answering a call twice and which calls the
conversation ends on, which kinds refuse them (their servers do), that none of these marks is the client's or in
the cache key, and the ids the gateway makes for calls sent without one."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gateway.cache.key import cache_key
from gateway.path.chat_request import normalize_chat
from providers.base import CallContext
from providers.call_ids import made_call_id
from providers.openai_chat import OpenAIChat, check_chat
from providers.registry import REGISTRY
from wire.chat import ChatRequest, decode_chat
from wire.errors import InvalidRequestError

# The kinds whose servers refuse a tool message that answers no call of its turn (providers/tool_results.py).
PAIRED = {"openai", "azure", "anthropic", "bedrock", "gemini", "mistral"}
# Those of them whose servers refuse a conversation ending on the calls too.
OPEN = {"anthropic", "bedrock", "gemini", "mistral"}


def _calls(*ids: str) -> dict[str, Any]:
    calls = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids]
    return {"role": "assistant", "tool_calls": calls}


def _result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


USER = {"role": "user", "content": "hi"}


def _req(*messages: dict[str, Any]) -> ChatRequest:
    return normalize_chat(decode_chat(msgspec.json.encode({"model": "m/x", "messages": list(messages)})))


@pytest.mark.parametrize(
    ("messages", "at"),
    [
        ((USER,), None),
        ((USER, _calls("a", "b"), _result("b"), _result("a")), None),
        # A user message between a turn's calls and their results leaves the results that turn's.
        ((USER, _calls("a"), USER, _result("a")), None),
        ((USER, _calls("a"), _result("b")), 2),
        ((USER, _result("a")), 1),
        ((USER, _calls("a"), _result("a"), {"role": "assistant", "content": "done"}, _result("a")), None),
        ((USER, _calls("a"), _result("a"), USER, _calls("c"), _result("c"), _result("a"), _result("x")), 6),
    ],
)
def test_the_first_result_answering_no_call_of_its_turn(messages: tuple[dict[str, Any], ...], at: int | None) -> None:
    assert _req(*messages).unanswered == at


DONE = {"role": "assistant", "content": "done"}


@pytest.mark.parametrize(
    ("messages", "unreplied", "repeated"),
    [
        ((USER, _calls("a", "b"), _result("b"), _result("a"), DONE), None, None),
        # A turn is closed by the next assistant message, or by the end of the conversation after its results.
        ((USER, _calls("a", "b"), _result("a"), DONE), 1, None),
        ((USER, _calls("a", "b"), _result("a")), 1, None),
        ((USER, _calls("a", "b"), _result("a"), USER), 1, None),
        ((USER, _calls("a"), _result("a"), _calls("b"), USER, _calls("c"), _result("c")), 3, None),
        # The calls as the last message: nothing follows them yet, and the server decides.
        ((USER, _calls("a")), None, None),
        ((USER, _calls("a", "b"), _result("a"), _result("a"), _result("b")), None, 3),
        ((USER, _calls("a", "b"), _result("a"), _result("a")), 1, 3),
        # One id in two turns: each turn answers its own call once.
        ((USER, _calls("a"), _result("a"), _calls("a"), _result("a")), None, None),
        # A result after the turn was closed by an assistant message is no duplicate of that turn's.
        ((USER, _calls("a"), _result("a"), DONE, _result("a")), None, None),
        # A result answering no call is `unanswered`, not a duplicate.
        ((USER, _calls("a"), _result("a"), _result("b"), _result("b")), None, None),
    ],
)
def test_calls_left_unanswered_and_results_given_twice(
    messages: tuple[dict[str, Any], ...], unreplied: int | None, repeated: int | None
) -> None:
    req = _req(*messages)
    assert (req.unreplied, req.repeated) == (unreplied, repeated)


@pytest.mark.parametrize(
    ("messages", "open_calls", "unreplied"),
    [
        ((USER,), None, None),
        ((USER, _calls("a")), 1, None),
        ((USER, _calls("a", "b"), _result("a")), None, 1),
        ((USER, _calls("a"), _result("a"), DONE), None, None),
        ((USER, _calls("a"), _result("a"), USER, _calls("b", "c")), 4, None),
        # An earlier turn left without a result is marked as it was, beside the calls the conversation ends on.
        ((USER, _calls("a"), USER, _calls("b")), 3, 1),
    ],
)
def test_the_calls_the_conversation_ends_on(
    messages: tuple[dict[str, Any], ...], open_calls: int | None, unreplied: int | None
) -> None:
    req = _req(*messages)
    assert (req.open_calls, req.unreplied) == (open_calls, unreplied)


def test_a_client_cannot_set_the_mark_itself() -> None:
    body = {
        "model": "m/x",
        "messages": [USER],
        " unanswered": 0,
        " unreplied": 0,
        " repeated": 0,
        " open_calls": 0,
        " thinking_back": True,
    }
    req = normalize_chat(decode_chat(msgspec.json.encode(body)))
    assert (req.unanswered, req.unreplied, req.repeated, req.open_calls, req.thinking_back) == (
        None,
        None,
        None,
        None,
        False,
    )


def test_the_marks_are_left_out_of_the_cache_key() -> None:
    # Made from the messages, which the key holds: the key is the request's as the client sent it, streamed or not.
    req = _req(USER, _calls("a"), _result("a"), _result("a"), _result("b"), USER, _calls("c"))
    assert (req.unanswered, req.unreplied, req.repeated, req.open_calls) == (4, None, 3, 6)
    unmarked = msgspec.structs.replace(req, unanswered=None, repeated=None, open_calls=None)
    streamed = msgspec.structs.replace(req, stream=True)
    assert cache_key(req, b"") == cache_key(unmarked, b"") == cache_key(streamed, b"")
    assert b" open_calls" not in cache_key(req, b"") and b" repeated" not in cache_key(streamed, b"")


def test_the_kinds_that_refuse_it() -> None:
    paired = {kind for kind, cls in REGISTRY.items() if issubclass(cls, OpenAIChat) and cls.chat_results_paired}
    assert paired == PAIRED


FAULTS = {
    "unanswered": ((USER, _calls("a"), _result("b")), "messages.tool_call_id", "'messages[2].tool_call_id' of 'b'"),
    "unreplied": (
        (USER, _calls("a", "b", "c"), _result("a"), DONE),
        "messages.tool_calls.id",
        "'messages[1].tool_calls[1].id' of 'b' has no tool message",
    ),
    "repeated": (
        (USER, _calls("a"), _result("a"), _result("a")),
        "messages.tool_call_id",
        "'messages[3].tool_call_id' of 'a' answers the call that messages[2] already answers",
    ),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("kind", sorted(k for k, c in REGISTRY.items() if issubclass(c, OpenAIChat)))
def test_check_chat_refuses_it_where_declared(kind: str, fault: str) -> None:
    adapter = REGISTRY[kind]()
    messages, param, said = FAULTS[fault]
    req = _req(*messages)
    if kind not in PAIRED:
        check_chat(adapter, req, "p")
        return
    with pytest.raises(InvalidRequestError) as refused:
        check_chat(adapter, req, "p")
    error = refused.value
    assert (error.param, error.code, error.status) == (param, "invalid_value", 400)
    assert said in error.message and "provider 'p'" in error.message
    # Another target of the plan may take the conversation; this one is not unhealthy for refusing it.
    assert error.elsewhere and error.no_call and not error.cools


def test_the_kinds_that_refuse_calls_as_the_last_message() -> None:
    refusing = {kind for kind, cls in REGISTRY.items() if issubclass(cls, OpenAIChat) and cls.chat_open_calls_refused}
    assert refusing == OPEN


@pytest.mark.parametrize("kind", sorted(k for k, c in REGISTRY.items() if issubclass(c, OpenAIChat)))
def test_calls_as_the_last_message_are_refused_where_declared(kind: str) -> None:
    adapter = REGISTRY[kind]()
    req = _req(USER, _calls("a"), _result("a"), USER, _calls("b", "c"))
    if kind not in OPEN:
        check_chat(adapter, req, "p")
        return
    with pytest.raises(InvalidRequestError) as refused:
        check_chat(adapter, req, "p")
    error = refused.value
    assert (error.param, error.code, error.status) == ("messages.tool_calls.id", "invalid_value", 400)
    assert "'messages[4].tool_calls[0].id' of 'b' has no tool message" in error.message
    assert "did not have response messages: b, c;" in error.message and "provider 'p'" in error.message
    assert error.elsewhere and error.no_call and not error.cools


def test_a_result_answering_no_call_is_reported_before_the_calls_left_last() -> None:
    req = _req(USER, _result("x"), _calls("a"))
    with pytest.raises(InvalidRequestError) as refused:
        check_chat(REGISTRY["anthropic"](), req, "p")
    assert refused.value.param == "messages.tool_call_id"


def test_made_ids_carry_the_choice_of_the_answer() -> None:
    ctx = CallContext(id="chatcmpl-abc123", created=1, model="m")
    assert made_call_id(ctx, 0, 1) == "call_abc123_0_1"
    # A fan-out's third call answers the answer's choice 2, its own choice 0.
    third = msgspec.structs.replace(ctx, first_choice=2)
    assert made_call_id(third, 0, 0) == "call_abc123_2_0" != made_call_id(ctx, 0, 0)
