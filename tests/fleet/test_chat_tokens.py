"""The engines' token-native chat answers through the official openai client: vLLM's `return_token_ids` on
/v1/chat/completions relayed plain and streamed, replayed from the cache the same way, refused by name where
the kind's chat route has no such field; what stopped a choice (`include_stop_reason`) from vLLM and SGLang.

The vLLM upstream answers in the shapes of vLLM's `ChatCompletionResponse` and `ChatCompletionStreamResponse`
(vllm/entrypoints/openai/chat_completion/protocol.py): each choice's `token_ids` and `stop_reason`, the
answer's `prompt_token_ids` (in a stream, on its first chunk only). The SGLang one in those of SGLang's
(python/sglang/srt/entrypoints/openai/protocol.py): each choice's `matched_stop`, plain and streamed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest
from aiohttp import web

from tests.helpers.servers import serve_config
from tests.helpers.upstreams import Received, Upstream

from .conftest import fleet_config

PROMPT_IDS = [151644, 872, 198, 6023]
HEAD = {"id": "chatcmpl-1", "created": 1700000000, "model": "m"}
USAGE = {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}


# vLLM's `prompt_logprobs` on chat: one entry per token of the rendered prompt, null for the first, each a map
# of token id to vLLM's `Logprob` (`logprob`, `rank`, `decoded_token`), the prompt's own token among them.
PROMPT_LOGPROBS = [
    None,
    {
        "872": {"logprob": -2.5, "rank": 4, "decoded_token": "user"},
        "77": {"logprob": -0.3, "rank": 1, "decoded_token": "x"},
    },
    {"198": {"logprob": -0.01, "rank": 1, "decoded_token": "\n"}},
    {
        "6023": {"logprob": -7.25, "rank": 880, "decoded_token": "hi"},
        "9": {"logprob": -1.0, "rank": 1, "decoded_token": "!"},
    },
]


def _plain(ids: bool, prompt_logprobs: bool = False) -> bytes:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "hi", "reasoning": None, "tool_calls": []},
        "logprobs": None,
        "finish_reason": "stop",
        "stop_reason": "END",  # the stop string that ended it (vLLM always sends the field)
        "token_ids": [11, 12] if ids else None,
    }
    body = {**HEAD, "object": "chat.completion", "choices": [choice], "usage": USAGE}
    top = {
        "prompt_logprobs": PROMPT_LOGPROBS if prompt_logprobs else None,
        "prompt_token_ids": PROMPT_IDS if ids else None,
    }
    return json.dumps({**body, **top}).encode()


def _event(choices: list[dict[str, Any]], **top: Any) -> bytes:
    return b"data: " + json.dumps({**HEAD, "object": "chat.completion.chunk", "choices": choices, **top}).encode()


def _stream() -> list[bytes]:
    def choice(delta: dict[str, Any], finish: str | None = None, **more: Any) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **more}

    return [
        _event([choice({"role": "assistant", "content": ""})], prompt_token_ids=PROMPT_IDS),
        _event([choice({"content": "h"}, stop_reason=None, token_ids=[11])]),
        _event([choice({"content": "i"}, "stop", stop_reason="END", token_ids=[12])]),
        _event([], usage=USAGE),
        b"data: [DONE]",
    ]


async def vllm_chat(request: web.Request, received: Received) -> web.StreamResponse:
    # As vLLM: the ids only when asked for (null otherwise, as its pydantic models write them).
    if not received.json().get("stream"):
        asked = received.json()
        answer = _plain(bool(asked.get("return_token_ids")), asked.get("prompt_logprobs") is not None)
        return web.Response(body=answer, content_type="application/json")
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for event in _stream():
        await resp.write(event + b"\n\n")
    await resp.write_eof()
    return resp


SGLANG_IDS = [31, 32]


async def sglang_chat(request: web.Request, received: Received) -> web.StreamResponse:
    finish = {"index": 0, "logprobs": None, "finish_reason": "stop", "matched_stop": "\n"}
    if not received.json().get("stream"):
        message = {"role": "assistant", "content": "hi", "reasoning_content": None, "tool_calls": None}
        choice: dict[str, Any] = {**finish, "message": message}
        if received.json().get("return_token_ids"):
            # SGLang's serving_chat.py: the prompt's ids and the sampled ones on each choice (absent unless asked).
            choice.update(prompt_token_ids=PROMPT_IDS, token_ids=SGLANG_IDS)
        body = {**HEAD, "object": "chat.completion", "choices": [choice], "usage": USAGE}
        return web.Response(body=json.dumps(body).encode(), content_type="application/json")
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    events: list[dict[str, Any]] = [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None, "matched_stop": None},
        {"index": 0, "delta": {"content": "hi"}, "finish_reason": None, "matched_stop": None},
        {**finish, "delta": {}},
    ]
    for choice in events:
        await resp.write(_event([choice]) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


@pytest.fixture
def sglang() -> Iterator[Upstream]:
    with Upstream() as side:
        side.handler = sglang_chat
        yield side


@pytest.fixture
def gateway(tmp_path: Path, replicas: list[Upstream], sglang: Upstream) -> Any:
    for u in replicas:
        u.handler = vllm_chat
    extra = f"""  sg: {{kind: sglang, base_url: {sglang.url}/v1, discover: false}}
  hosted: {{kind: openai, api_key: sk-x, base_url: {replicas[0].url}/v1}}
cache: {{mode: always}}
models:
  - name: tokens
    strategy: ordered
    targets: [{{model: sg/m}}, {{model: engine/m}}]
  - name: nowhere
    strategy: ordered
    targets: [{{model: hosted/gpt-4o-mini}}, {{model: sg/m}}]
"""
    with serve_config(tmp_path, fleet_config(replicas, "policy: round_robin", extra=extra)) as gw:
        yield gw


def _extra(obj: pydantic.BaseModel) -> dict[str, Any]:
    """What the openai client kept of an answer's fields outside OpenAI's types."""
    return obj.model_extra or {}


def _sent(replicas: list[Upstream]) -> list[dict[str, Any]]:
    return [r.json() for u in replicas for r in u.received]


def _streamed(client: openai.OpenAI, **body: Any) -> tuple[list[int] | None, list[int], str]:
    chunks = list(client.chat.completions.create(stream=True, **body))
    prompt = [_extra(c).get("prompt_token_ids") for c in chunks if _extra(c).get("prompt_token_ids")]
    assert len(prompt) <= 1  # once, on the first chunk that has it
    assert _extra(chunks[0]).get("prompt_token_ids") == (prompt[0] if prompt else None)
    ids = [i for c in chunks for ch in c.choices for i in (_extra(ch).get("token_ids") or ())]
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    return prompt[0] if prompt else None, ids, text


def test_token_ids_are_relayed_plain_streamed_and_from_the_cache(gateway: Any, replicas: list[Upstream]) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0)
    ask: dict[str, Any] = {
        "model": "engine/m",
        "messages": [{"role": "user", "content": "hi"}],
        "extra_body": {"return_token_ids": True},
    }
    answer = client.chat.completions.create(**ask)
    choice = answer.choices[0]
    assert _extra(answer)["prompt_token_ids"] == PROMPT_IDS
    assert _extra(choice)["token_ids"] == [11, 12] and choice.message.content == "hi"
    assert _sent(replicas)[-1]["return_token_ids"] is True
    # The same request again: the cache's answer carries the same ids, and no engine is asked.
    calls = len(_sent(replicas))
    again = client.chat.completions.with_raw_response.create(**ask)
    assert again.headers.get("x-gateway-cache") == "hit"
    hit = again.parse()
    assert _extra(hit)["prompt_token_ids"] == PROMPT_IDS and _extra(hit.choices[0])["token_ids"] == [11, 12]
    assert len(_sent(replicas)) == calls

    # Streamed: the prompt's ids on the first chunk, each chunk's own ids; the assembled stream is stored, and a
    # streamed hit replays the same ids.
    streamed: dict[str, Any] = {**ask, "messages": [{"role": "user", "content": "streamed"}]}
    assert _streamed(client, **streamed) == (PROMPT_IDS, [11, 12], "hi")
    calls = len(_sent(replicas))
    assert _streamed(client, **streamed) == (PROMPT_IDS, [11, 12], "hi")
    buffered_hit = client.chat.completions.create(**streamed)
    assert _extra(buffered_hit.choices[0])["token_ids"] == [11, 12]
    assert _extra(buffered_hit)["prompt_token_ids"] == PROMPT_IDS
    assert len(_sent(replicas)) == calls

    # Asked for nothing, the answer has no such fields, and the engine is not asked for them either.
    plain = client.chat.completions.create(model="engine/m", messages=[{"role": "user", "content": "no ids"}])
    assert "token_ids" not in _extra(plain.choices[0]) and "prompt_token_ids" not in _extra(plain)
    assert plain.choices[0].logprobs is None and "return_token_ids" not in _sent(replicas)[-1]


def _ids_stream_refused(client: openai.OpenAI, model: str, content: str) -> dict[str, Any]:
    """The 400 a streamed chat request for token ids gets from `model`: it names `return_token_ids`."""
    with pytest.raises(openai.BadRequestError) as refused:
        list(
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": content}],
                stream=True,
                extra_body={"return_token_ids": True},
            )
        )
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "return_token_ids", error
    return error


def test_sglangs_chat_token_ids_come_back_in_vllms_shape(gateway: Any, sglang: Upstream) -> None:
    # SGLang writes the prompt's ids on each choice; the client reads them at the answer's top, as from vLLM.
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0)
    ask: dict[str, Any] = {"model": "sg/m", "messages": [{"role": "user", "content": "ids from sglang"}]}
    answer = client.chat.completions.create(**ask, extra_body={"return_token_ids": True})
    assert sglang.received[-1].json()["return_token_ids"] is True
    assert _extra(answer)["prompt_token_ids"] == PROMPT_IDS
    assert _extra(answer.choices[0])["token_ids"] == SGLANG_IDS
    assert "prompt_token_ids" not in _extra(answer.choices[0])
    # A streamed hit of the stored answer replays them as vLLM streams them.
    calls = len(sglang.received)
    assert _streamed(client, **ask, extra_body={"return_token_ids": True}) == (PROMPT_IDS, SGLANG_IDS, "hi")
    assert len(sglang.received) == calls

    # Asked for nothing: no ids, and SGLang is not asked for them.
    plain = client.chat.completions.create(model="sg/m", messages=[{"role": "user", "content": "no ids"}])
    assert "prompt_token_ids" not in _extra(plain) and "token_ids" not in _extra(plain.choices[0])
    assert "return_token_ids" not in sglang.received[-1].json()

    # A stream that is not a cache hit: SGLang's chat route sends no ids in streams, so it is refused by name.
    error = _ids_stream_refused(client, "sg/m", "a fresh stream")
    assert error["code"] == "unsupported_parameter" and "not streamed" in error["message"]
    assert len(sglang.received) == calls + 1  # only the plain request above reached it


def test_a_target_that_cannot_honour_a_field_passes_the_request_to_one_that_can(
    gateway: Any, replicas: list[Upstream], sglang: Upstream
) -> None:
    # `tokens` tries SGLang first: a streamed request for ids, which SGLang cannot serve, goes to vLLM, with no
    # call to SGLang and no cooldown of it; a buffered one is SGLang's.
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0)
    ask: dict[str, Any] = {"model": "tokens", "extra_body": {"return_token_ids": True}}
    before, engine_before = len(sglang.received), len(_sent(replicas))
    streamed = _streamed(client, **ask, messages=[{"role": "user", "content": "stream me ids"}])
    assert streamed == (PROMPT_IDS, [11, 12], "hi")  # vLLM's
    assert len(sglang.received) == before and len(_sent(replicas)) == engine_before + 1
    raw = client.chat.completions.with_raw_response.create(**ask, messages=[{"role": "user", "content": "buffered"}])
    assert _extra(raw.parse().choices[0])["token_ids"] == SGLANG_IDS  # SGLang is not cooling: it serves this
    assert raw.headers["x-gateway-attempts"] == "1" and len(sglang.received) == before + 1

    # No target of `nowhere` can stream ids: the last refusal, naming the field, and no upstream call at all.
    assert "'sg'" in _ids_stream_refused(client, "nowhere", "nobody streams ids")["message"]
    assert len(sglang.received) == before + 1 and len(_sent(replicas)) == engine_before + 1


def test_token_ids_are_refused_by_name_on_other_chat_routes(gateway: Any, replicas: list[Upstream]) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0)
    before = len(_sent(replicas))
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="hosted/gpt-4o-mini",
            messages=[{"role": "user", "content": "x"}],
            extra_body={"return_token_ids": True},
        )
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "return_token_ids"
    assert error["code"] == "unsupported_parameter"
    assert len(_sent(replicas)) == before  # refused before any upstream call


def test_what_stopped_a_chat_choice_is_relayed_when_asked(gateway: Any) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0)
    for model, why in (("engine/m", "END"), ("sg/m", "\n")):
        ask: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": f"why {model}"}]}
        ask["extra_body"] = {"include_stop_reason": True}
        assert _extra(client.chat.completions.create(**ask).choices[0])["stop_reason"] == why, model
        finishing = [ch for c in client.chat.completions.create(stream=True, **ask) for ch in c.choices]
        reasons = [(ch.finish_reason, _extra(ch).get("stop_reason")) for ch in finishing]
        assert reasons[-1] == ("stop", why) and all(r == (None, None) for r in reasons[:-1]), model
        # Not asked for, it is not relayed (each engine always sends its own field).
        plain = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "unasked"}])
        assert "stop_reason" not in _extra(plain.choices[0]) and "matched_stop" not in _extra(plain.choices[0])
    # A streamed miss stored in the cache keeps it: the same request buffered is a hit that says it too.
    streamed: dict[str, Any] = {"model": "engine/m", "messages": [{"role": "user", "content": "stored"}]}
    streamed["extra_body"] = {"include_stop_reason": True}
    list(client.chat.completions.create(stream=True, **streamed))
    hit = client.chat.completions.with_raw_response.create(**streamed)
    assert hit.headers.get("x-gateway-cache") == "hit" and _extra(hit.parse().choices[0])["stop_reason"] == "END"


def test_prompt_logprobs_on_vllms_chat_route(gateway: Any, replicas: list[Upstream]) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0)
    ask: dict[str, Any] = {
        "model": "engine/m",
        "messages": [{"role": "user", "content": "score me"}],
        "extra_body": {"prompt_logprobs": 1},
    }
    answer = client.chat.completions.create(**ask)
    assert _extra(answer)["prompt_logprobs"] == PROMPT_LOGPROBS and answer.choices[0].message.content == "hi"
    assert _sent(replicas)[-1]["prompt_logprobs"] == 1
    # The cache keeps them with the answer.
    calls = len(_sent(replicas))
    again = client.chat.completions.with_raw_response.create(**ask)
    assert again.headers.get("x-gateway-cache") == "hit" and _extra(again.parse())["prompt_logprobs"] == PROMPT_LOGPROBS
    assert len(_sent(replicas)) == calls
    # Not asked for, not there.
    plain = client.chat.completions.create(model="engine/m", messages=[{"role": "user", "content": "plain"}])
    assert "prompt_logprobs" not in _extra(plain)

    # vLLM gives them on buffered answers only, and at most its --max-logprobs; other chat routes have none.
    refusals: list[tuple[dict[str, Any], str]] = [
        ({**ask, "stream": True}, "invalid_value"),
        ({**ask, "extra_body": {"prompt_logprobs": 21}}, "unsupported_parameter"),
        ({**ask, "model": "sg/m"}, "unsupported_parameter"),
        ({**ask, "model": "hosted/gpt-4o-mini"}, "unsupported_parameter"),
    ]
    for body, code in refusals:
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**body)
        error = refused.value.body
        assert isinstance(error, dict) and (error["param"], error["code"]) == ("prompt_logprobs", code), body
    assert len(_sent(replicas)) == calls + 1  # the plain request alone went upstream
