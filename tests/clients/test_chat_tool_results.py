"""A tool message must answer a call of the nearest assistant message before it with tool calls, and each call of a
turn wants one tool message before the next assistant message: a result answering no call, a call left without a
result, a call answered twice are refused, with a 400 naming the message, before any upstream call on the kinds
whose servers refuse them (openai, anthropic, gemini, mistral; azure and bedrock declare it too:
tests/unit/test_tool_results.py), sent as they are to the self-hosted servers, which take any conversation; calls
left as the last message are refused where the server refuses them too (anthropic, gemini, mistral). With the
official `openai` SDK, over real sockets.

The upstream is a loopback server answering from the recordings (tests/fixtures/SOURCES.md): OpenAI's chat
answer on the OpenAI wire, Anthropic's Messages answer, Gemini's generateContent answer.
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
timeouts: {{connect_ms: 2000, first_byte_ms: 10000, total_ms: 20000}}
providers:
  oa: {{kind: openai, base_url: {u}/oa/v1, api_key: sk-oa}}
  claude: {{kind: anthropic, base_url: {u}/claude, api_key: sk-ant, default_max_tokens: 64}}
  gem: {{kind: gemini, base_url: {u}/gemini, api_key: g-key}}
  mis: {{kind: mistral, base_url: {u}/mistral, api_key: m-key}}
  hosted: {{kind: vllm, base_url: {u}/vllm/v1}}
  llama: {{kind: llamacpp, base_url: {u}/llama}}
models:
  - name: strict-first
    targets: [{{model: oa/gpt-4o-mini}}]
    fallbacks: [hosted/served]
  - name: open-calls-first
    targets: [{{model: claude/claude-sonnet-4-5}}]
    fallbacks: [hosted/served]
"""
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
STRICT = ["oa/gpt-4o-mini", "claude/claude-sonnet-4-5", "gem/gemini-2.5-flash", "mis/mistral-small-latest"]
LENIENT = ["hosted/served", "llama/served"]


def _calls(*ids: str) -> dict[str, Any]:
    calls = [
        {"id": i, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        for i in ids
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def _result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "18C"}


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# (conversation, the index of the tool message refused, whether an assistant message before it has calls)
UNANSWERED: dict[str, tuple[list[Any], int, bool]] = {
    "another id": ([_user("Weather in Paris?"), _calls("call_a"), _result("call_b")], 2, True),
    "an older turn's call": (
        [_user("Paris?"), _calls("call_a"), _result("call_a"), _user("And Lyon?"), _calls("call_c"), _result("call_a")],
        5,
        True,
    ),
    "no call before": ([_user("Weather in Paris?"), _result("call_z")], 1, False),
}
DONE: dict[str, Any] = {"role": "assistant", "content": "Done."}
# (conversation, the assistant message whose call goes unanswered, the index of that call, the calls unanswered)
UNREPLIED: dict[str, tuple[list[Any], int, int, list[str]]] = {
    "closed by the next assistant message": (
        [_user("Paris and Lyon?"), _calls("call_a", "call_b"), _result("call_a"), DONE, _user("Thanks")],
        1,
        1,
        ["call_b"],
    ),
    "closed by the end of the conversation": (
        [_user("Paris, Lyon, Nice?"), _calls("call_a", "call_b", "call_c"), _result("call_b")],
        1,
        0,
        ["call_a", "call_c"],
    ),
    "no result before the user speaks again": (
        [_user("Paris?"), _calls("call_a"), _user("Never mind: Lyon?")],
        1,
        0,
        ["call_a"],
    ),
}
# (conversation, the index of the second tool message answering a call, the index of the first)
REPEATED: dict[str, tuple[list[Any], int, int]] = {
    "one call answered twice": ([_user("Paris?"), _calls("call_a"), _result("call_a"), _result("call_a")], 3, 2),
    "between the results of others": (
        [
            _user("Paris and Lyon?"),
            _calls("call_a", "call_b"),
            _result("call_b"),
            _result("call_a"),
            _result("call_b"),
            DONE,
        ],
        4,
        2,
    ),
}
# The calls as the last message: nothing answers them yet. Anthropic, Gemini and Mistral refuse it; OpenAI's
# answer to it is not documented, so it goes as it is there, as to the self-hosted servers.
OPEN_CALLS: list[Any] = [_user("Weather in Paris and Lyon?"), _calls("call_a", "call_b")]
OPEN_REFUSED = ["claude/claude-sonnet-4-5", "gem/gemini-2.5-flash", "mis/mistral-small-latest"]
# Parallel calls answered in another order, then a later turn whose call is answered: every result pairs.
ANSWERED: list[Any] = [
    _user("Weather in Paris and Lyon?"),
    _calls("call_a", "call_b"),
    _result("call_b"),
    _result("call_a"),
    {"role": "assistant", "content": "18C in both."},
    _user("And Nice?"),
    _calls("call_c"),
    _result("call_c"),
]


async def _handler(request: web.Request, received: Received) -> web.StreamResponse:
    if received.path.startswith("/claude/"):
        name = "anthropic/messages_end_turn.json"
    elif received.path.startswith("/gemini/"):
        name = "gemini/generate_content_stop_sequence.json"
    else:
        name = "openai/chat_completion.json"
    return web.Response(body=fixture_bytes(name), content_type="application/json")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        server.handler = _handler
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("chat-tool-results"), CONFIG.format(u=upstream.url), {}) as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gateway: GatewayThread) -> Iterator[openai.OpenAI]:
    sdk = openai_client(gateway.url + "/v1", "unused")
    yield sdk
    sdk.close()


@pytest.fixture
def received(upstream: Upstream, gateway: GatewayThread) -> Iterator[list[Received]]:
    upstream.received = []
    gateway.pipeline.health.reset()
    yield upstream.received


@pytest.mark.parametrize("case", sorted(UNANSWERED))
@pytest.mark.parametrize("model", STRICT)
def test_a_result_that_answers_no_call_of_its_turn_is_refused_before_any_call(
    client: openai.OpenAI, received: list[Received], model: str, case: str
) -> None:
    messages, at, turn = UNANSWERED[case]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    error: Any = refused.value.body
    assert (error["param"], error["code"], error["type"]) == (
        "messages.tool_call_id",
        "invalid_value",
        "invalid_request_error",
    )
    message = error["message"]
    assert message.startswith(f"Invalid parameter: 'messages[{at}].tool_call_id' of '{messages[at]['tool_call_id']}'")
    assert ("not found in 'tool_calls'" in message) is turn
    assert f"provider '{model.split('/')[0]}'" in message
    assert received == []


@pytest.mark.parametrize("case", sorted(UNREPLIED))
@pytest.mark.parametrize("model", STRICT)
def test_a_call_left_without_a_result_is_refused_before_any_call(
    client: openai.OpenAI, received: list[Received], model: str, case: str
) -> None:
    messages, at, j, missing = UNREPLIED[case]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    error: Any = refused.value.body
    assert (error["param"], error["code"], error["type"]) == (
        "messages.tool_calls.id",
        "invalid_value",
        "invalid_request_error",
    )
    message = error["message"]
    assert message.startswith(f"Invalid parameter: 'messages[{at}].tool_calls[{j}].id' of '{missing[0]}'")
    assert f"did not have response messages: {', '.join(missing)};" in message
    assert f"provider '{model.split('/')[0]}'" in message
    assert received == []


@pytest.mark.parametrize("case", sorted(REPEATED))
@pytest.mark.parametrize("model", STRICT)
def test_a_call_answered_twice_is_refused_before_any_call(
    client: openai.OpenAI, received: list[Received], model: str, case: str
) -> None:
    messages, at, first = REPEATED[case]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    error: Any = refused.value.body
    assert (error["param"], error["code"], error["type"]) == (
        "messages.tool_call_id",
        "invalid_value",
        "invalid_request_error",
    )
    assert error["message"].startswith(
        f"Invalid parameter: 'messages[{at}].tool_call_id' of '{messages[at]['tool_call_id']}' answers the call "
        f"that messages[{first}] already answers"
    )
    assert f"provider '{model.split('/')[0]}'" in error["message"]
    assert received == []


@pytest.mark.parametrize("model", STRICT + LENIENT)
def test_results_that_answer_their_turn_are_sent(client: openai.OpenAI, received: list[Received], model: str) -> None:
    answer = client.chat.completions.create(model=model, messages=ANSWERED, tools=TOOLS)
    assert answer.choices[0].message.content
    assert len(received) == 1


@pytest.mark.parametrize("case", sorted(UNANSWERED))
@pytest.mark.parametrize("model", LENIENT)
def test_self_hosted_servers_get_the_conversation_as_it_is(
    client: openai.OpenAI, received: list[Received], model: str, case: str
) -> None:
    messages, at, _ = UNANSWERED[case]
    answer = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    assert answer.choices[0].message.content
    (sent,) = received
    assert sent.json()["messages"][at] == messages[at]


@pytest.mark.parametrize(
    "messages",
    [UNREPLIED[case][0] for case in sorted(UNREPLIED)] + [REPEATED[case][0] for case in sorted(REPEATED)],
)
@pytest.mark.parametrize("model", LENIENT)
def test_self_hosted_servers_get_unanswered_calls_and_repeated_results_as_they_are(
    client: openai.OpenAI, received: list[Received], model: str, messages: list[Any]
) -> None:
    answer = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    assert answer.choices[0].message.content
    (sent,) = received
    got = sent.json()["messages"]
    assert [(m["role"], m.get("tool_call_id"), [c["id"] for c in m.get("tool_calls", ())]) for m in got] == [
        (m["role"], m.get("tool_call_id"), [c["id"] for c in m.get("tool_calls", ())]) for m in messages
    ]


def test_an_alias_moves_on_to_a_target_that_takes_the_conversation(
    client: openai.OpenAI, received: list[Received]
) -> None:
    # The refusal is the first target's server's rule, made before any call: the fallback's server takes it.
    messages, at, _ = UNANSWERED["another id"]
    answer = client.chat.completions.create(model="strict-first", messages=messages, tools=TOOLS)
    assert answer.choices[0].message.content
    (sent,) = received
    assert sent.path == "/vllm/v1/chat/completions"
    assert sent.json()["messages"][at] == messages[at]


@pytest.mark.parametrize(
    "messages", [UNREPLIED["closed by the end of the conversation"][0], REPEATED["one call answered twice"][0]]
)
def test_an_alias_moves_on_from_either_fault_too(
    client: openai.OpenAI, received: list[Received], messages: list[Any]
) -> None:
    answer = client.chat.completions.create(model="strict-first", messages=messages, tools=TOOLS)
    assert answer.choices[0].message.content
    (sent,) = received
    assert sent.path == "/vllm/v1/chat/completions"


@pytest.mark.parametrize("model", OPEN_REFUSED)
def test_calls_as_the_last_message_are_refused_before_any_call_where_the_server_refuses_them(
    client: openai.OpenAI, received: list[Received], model: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=OPEN_CALLS, tools=TOOLS)
    error: Any = refused.value.body
    assert (error["param"], error["code"], error["type"]) == (
        "messages.tool_calls.id",
        "invalid_value",
        "invalid_request_error",
    )
    message = error["message"]
    assert message.startswith("Invalid parameter: 'messages[1].tool_calls[0].id' of 'call_a' has no tool message")
    assert "did not have response messages: call_a, call_b;" in message
    assert f"provider '{model.split('/')[0]}'" in message
    assert received == []


@pytest.mark.parametrize("model", ["oa/gpt-4o-mini", *LENIENT])
def test_calls_as_the_last_message_go_as_they_are_elsewhere(
    client: openai.OpenAI, received: list[Received], model: str
) -> None:
    answer = client.chat.completions.create(model=model, messages=OPEN_CALLS, tools=TOOLS)
    assert answer.choices[0].message.content
    (sent,) = received
    got = sent.json()["messages"]
    assert [m["role"] for m in got] == ["user", "assistant"]
    assert [c["id"] for c in got[1]["tool_calls"]] == ["call_a", "call_b"]
    assert not [name for name in sent.json() if name.strip() != name or "open_calls" in name]


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no tools", "tools"])
@pytest.mark.parametrize("model", OPEN_REFUSED)
def test_a_conversation_not_ending_on_calls_is_sent_where_calls_left_last_are_refused(
    client: openai.OpenAI, received: list[Received], model: str, tools: list[Any] | None
) -> None:
    messages: list[Any] = [_user("Weather in Paris?"), DONE, _user("And Lyon?")]
    answer = client.chat.completions.create(model=model, messages=messages, tools=tools or openai.omit)
    assert answer.choices[0].message.content
    (sent,) = received
    # The gateway's marks are its own: no field of theirs reaches the upstream.
    assert not [name for name in sent.json() if name.strip() != name or "open_calls" in name]


def test_an_alias_moves_on_from_calls_left_last(client: openai.OpenAI, received: list[Received]) -> None:
    answer = client.chat.completions.create(model="open-calls-first", messages=OPEN_CALLS, tools=TOOLS)
    assert answer.choices[0].message.content
    (sent,) = received
    assert sent.path == "/vllm/v1/chat/completions"


# A client's id of 200 KB: each refusal quotes a bounded prefix of it, never the whole id.
LONG = "call_" + "x" * 200_000
LONG_CASES: dict[str, list[Any]] = {
    "answers no call": [_user("Paris?"), _calls("call_a"), _result(LONG)],
    "left without a result": [_user("Paris?"), _calls(*(f"{LONG}{i}" for i in range(20))), DONE],
    "answered twice": [_user("Paris?"), _calls(LONG), _result(LONG), _result(LONG)],
    "arguments not an object": [
        _user("Paris?"),
        {
            "role": "assistant",
            "tool_calls": [{"id": LONG, "type": "function", "function": {"name": "f", "arguments": "[]"}}],
        },
        _result(LONG),
    ],
}


@pytest.mark.parametrize("case", sorted(LONG_CASES))
def test_a_long_client_id_is_quoted_cut_in_the_refusal(
    client: openai.OpenAI, received: list[Received], case: str
) -> None:
    model = "claude/claude-sonnet-4-5" if case == "arguments not an object" else "oa/gpt-4o-mini"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=LONG_CASES[case], tools=TOOLS)
    message = refused.value.body["message"]  # type: ignore[index]
    assert "call_xxxxxxxxxx" in message and "x..." in message, message[:300]
    assert len(message) < 2_000, len(message)
    assert received == []
