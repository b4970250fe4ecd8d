"""An upstream's answer whose lists do not line up with what was asked: its choices, and its logprobs.

Choices must be numbered 0 to (choices asked) - 1, each once. A choice numbered below 0, past what was asked,
twice, or more choices than asked for, used to reach the client as it came (an evaluation harness reading
`choices[i]` then scores the wrong prompt). Such an answer is now a failed attempt (502
`invalid_upstream_response`, tried elsewhere), in a stream an error event; choices that are all there but listed
out of order are put in order.

Legacy logprobs are parallel lists (`tokens`, `token_logprobs`, `top_logprobs`), and Gemini's `chosenCandidates`
and `topCandidates` a step each. Lists of other lengths reached the client as they came, and where the gateway cut
the answer at a stop sequence it enforces itself, the cut read past a list's end: a 500. Such an answer is now
unreadable (502 `invalid_upstream_response`).

Over real sockets: the gateway served by uvicorn, one aiohttp loopback upstream speaking the OpenAI, vLLM and
Gemini wire formats.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.helpers.clients import sse_data
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Handler, Received, Upstream, reply, reply_sse

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
# same_target 0: a failed attempt is never tried again on its own target, only on the next one of an alias.
retries: {{attempts: 2, same_target: 0, initial_backoff_ms: 1, max_backoff_ms: 2}}
providers:
  oa: {{kind: openai, api_key: sk-test-000000000000, base_url: "{u}/v1"}}
  alt: {{kind: openai, api_key: sk-test-000000000001, base_url: "{u}/alt/v1"}}
  vl: {{kind: vllm, base_url: "{u}/v1"}}
  gn: {{kind: gemini, api_key: gk-test-0000000000, base_url: "{u}", max_n: 4}}
models:
  - name: pair
    strategy: ordered
    targets: [{{model: oa/m}}, {{model: alt/m}}]
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("choice-numbers"), CONFIG.format(u=upstream.url)) as gw:
        yield gw


@pytest.fixture
def api(gateway: GatewayThread, upstream: Upstream) -> Iterator[httpx.Client]:
    gateway.pipeline.health.reset()
    upstream.received.clear()
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as client:
        yield client


def completion(indexes: list[int]) -> bytes:
    choices = [{"text": f"t{i}", "index": i, "logprobs": None, "finish_reason": "stop"} for i in indexes]
    usage = {"prompt_tokens": 1, "completion_tokens": len(indexes), "total_tokens": 1 + len(indexes)}
    return json.dumps(
        {"id": "x", "object": "text_completion", "created": 1, "model": "m", "choices": choices, "usage": usage}
    ).encode()


def chat(indexes: list[int]) -> bytes:
    choices = [
        {"index": i, "message": {"role": "assistant", "content": f"t{i}"}, "finish_reason": "stop"} for i in indexes
    ]
    usage = {"prompt_tokens": 1, "completion_tokens": len(indexes), "total_tokens": 1 + len(indexes)}
    return json.dumps(
        {"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": choices, "usage": usage}
    ).encode()


def candidates(indexes: list[int]) -> bytes:
    """Gemini's generateContent answer (the shape of the recording in tests/fixtures/gemini), a candidate each."""
    listed = [
        {
            "content": {"parts": [{"text": f"t{i}"}], "role": "model"},
            "finishReason": "STOP",
            "index": i,
            "logprobsResult": {"chosenCandidates": [{"token": f"t{i}", "logProbability": -0.5 - i}]},
        }
        for i in indexes
    ]
    usage = {"promptTokenCount": 1, "candidatesTokenCount": len(indexes), "totalTokenCount": 1 + len(indexes)}
    return json.dumps({"candidates": listed, "usageMetadata": usage}).encode()


def event(index: int, text: str, finish: str | None = None) -> bytes:
    choice = {"text": text, "index": index, "logprobs": None, "finish_reason": finish}
    return (
        b"data: "
        + json.dumps({"id": "x", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}).encode()
    )


BROKEN = [[-1, 5], [0, 0], [10**18, 1], [0, 1, 2], [1, 1]]


def refused(resp: httpx.Response) -> None:
    assert resp.status_code == 502, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_upstream_response"
    assert "not numbered 0 to" in error["message"]


@pytest.mark.parametrize("indexes", BROKEN, ids=str)
@pytest.mark.parametrize("model", ["oa/m", "vl/m"])
def test_choices_numbered_otherwise_than_asked_are_a_failed_attempt(
    api: httpx.Client, upstream: Upstream, model: str, indexes: list[int]
) -> None:
    upstream.handler = reply(completion(indexes))
    refused(api.post("/v1/completions", json={"model": model, "prompt": "p", "max_tokens": 3, "n": 2}))


@pytest.mark.parametrize("indexes", [[3], [-1], [0, 1]], ids=str)
def test_one_prompt_without_n_takes_one_choice_numbered_zero(
    api: httpx.Client, upstream: Upstream, indexes: list[int]
) -> None:
    upstream.handler = reply(completion(indexes))
    refused(api.post("/v1/completions", json={"model": "oa/m", "prompt": "p", "max_tokens": 3}))


def test_choices_out_of_order_are_put_in_order(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply(completion([2, 0, 3, 1]))
    resp = api.post("/v1/completions", json={"model": "vl/m", "prompt": ["a", "b"], "max_tokens": 3, "n": 2})
    assert resp.status_code == 200, resp.text
    assert [(c["index"], c["text"]) for c in resp.json()["choices"]] == [(0, "t0"), (1, "t1"), (2, "t2"), (3, "t3")]


@pytest.mark.parametrize(
    ("prompt", "indexes", "ok"),
    [
        (["a", "b", "c"], [0, 1], False),  # a prompt left unanswered
        (["a", "b", "c"], [0, 1, 2], True),
        ([[1, 2], [3, 4]], [0, 1], True),  # token-id prompts: a choice each as well
        ([[1, 2], [3, 4]], [0, 2], False),
    ],
)
def test_a_list_of_prompts_takes_a_choice_per_prompt(
    api: httpx.Client, upstream: Upstream, prompt: list[Any], indexes: list[int], ok: bool
) -> None:
    upstream.handler = reply(completion(indexes))
    resp = api.post("/v1/completions", json={"model": "vl/m", "prompt": prompt, "max_tokens": 3})
    if ok:
        assert resp.status_code == 200, resp.text
        assert [c["index"] for c in resp.json()["choices"]] == indexes
    else:
        refused(resp)


@pytest.mark.parametrize("indexes", [[0, 0, 1], [0, 1, 7], [0, 1, 2, 3]], ids=str)
def test_best_of_candidates_in_one_call_are_checked_before_they_are_ranked(
    api: httpx.Client, upstream: Upstream, indexes: list[int]
) -> None:
    upstream.handler = reply(candidates(indexes))
    refused(api.post("/v1/completions", json={"model": "gn/m", "prompt": "p", "max_tokens": 3, "best_of": 3}))
    assert len(upstream.received) == 1


@pytest.mark.parametrize(("indexes", "ok"), [([1, 0], True), ([0, 0], False), ([0, 2], False), ([0, 1, 2], False)])
def test_chat_choices_are_checked_the_same_way(
    api: httpx.Client, upstream: Upstream, indexes: list[int], ok: bool
) -> None:
    upstream.handler = reply(chat(indexes))
    body = {"model": "oa/m", "messages": [{"role": "user", "content": "p"}], "n": 2}
    resp = api.post("/v1/chat/completions", json=body)
    if ok:
        assert resp.status_code == 200, resp.text
        assert [(c["index"], c["message"]["content"]) for c in resp.json()["choices"]] == [(0, "t0"), (1, "t1")]
    else:
        refused(resp)


@pytest.mark.parametrize("bad", [7, 2, -1])
def test_a_stream_event_numbered_out_of_range_ends_the_stream_with_an_error(
    api: httpx.Client, upstream: Upstream, bad: int
) -> None:
    upstream.handler = reply_sse(
        [
            event(0, "a"),
            event(1, "b"),
            event(bad, "evil"),
            event(0, "c", "stop"),
            event(1, "d", "stop"),
            b"data: [DONE]",
        ]
    )
    resp = api.post("/v1/completions", json={"model": "oa/m", "prompt": "p", "max_tokens": 3, "n": 2, "stream": True})
    assert resp.status_code == 200, resp.text
    data = sse_data(resp.text)
    chunks = [json.loads(d) for d in data if d != "[DONE]"]
    assert [c["choices"][0]["text"] for c in chunks if "choices" in c] == ["a", "b"]
    assert chunks[-1]["error"]["code"] == "invalid_upstream_response"
    assert "evil" not in resp.text


def test_a_stream_of_token_id_prompts_numbers_a_choice_per_prompt(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = reply_sse(
        [event(1, "b"), event(0, "a"), event(0, "c", "stop"), event(1, "d", "stop"), b"data: [DONE]"]
    )
    body = {"model": "vl/m", "prompt": [[1, 2], [3, 4]], "max_tokens": 3, "stream": True}
    resp = api.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    chunks = [json.loads(d) for d in sse_data(resp.text) if d != "[DONE]"]
    assert [(c["choices"][0]["index"], c["choices"][0]["text"]) for c in chunks] == [
        (1, "b"),
        (0, "a"),
        (0, "c"),
        (1, "d"),
    ]


def chat_event(index: int, text: str, finish: str | None = None) -> bytes:
    choice = {"index": index, "delta": {"content": text}, "finish_reason": finish}
    chunk = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    return b"data: " + json.dumps(chunk).encode()


def test_a_chat_stream_event_numbered_past_n_ends_the_stream_with_an_error(
    api: httpx.Client, upstream: Upstream
) -> None:
    upstream.handler = reply_sse(
        [chat_event(0, "a"), chat_event(1, "b"), chat_event(2, "evil"), chat_event(0, "c", "stop"), b"data: [DONE]"]
    )
    body = {"model": "oa/m", "messages": [{"role": "user", "content": "p"}], "n": 2, "stream": True}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    chunks = [json.loads(d) for d in sse_data(resp.text) if d != "[DONE]"]
    assert [c["choices"][0]["delta"].get("content") for c in chunks if c.get("choices")] == ["a", "b"]
    assert chunks[-1]["error"]["code"] == "invalid_upstream_response"
    assert "evil" not in resp.text


@pytest.mark.parametrize("bad", [2, -1])
def test_a_first_stream_event_numbered_out_of_range_fails_before_the_first_byte(
    api: httpx.Client, upstream: Upstream, bad: int
) -> None:
    # Nothing reached the client yet: a failed attempt, as an unreadable first event is (502, tried elsewhere).
    upstream.handler = reply_sse([event(bad, "evil"), event(0, "a", "stop"), event(1, "b", "stop"), b"data: [DONE]"])
    resp = api.post("/v1/completions", json={"model": "oa/m", "prompt": "p", "max_tokens": 3, "n": 2, "stream": True})
    assert resp.status_code == 502, resp.text
    assert resp.json()["error"]["code"] == "invalid_upstream_response"
    assert "evil" not in resp.text


def by_path(first: Handler, alt: Handler) -> Handler:
    """`alt` answers the alias's second target (its base URL under /alt), `first` every other."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        return await (alt if received.path.startswith("/alt/") else first)(request, received)

    return handler


def test_choices_numbered_otherwise_fail_over_to_the_next_target(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = by_path(reply(completion([0, 0])), reply(completion([0, 1])))
    resp = api.post("/v1/completions", json={"model": "pair", "prompt": "p", "max_tokens": 3, "n": 2})
    assert resp.status_code == 200, resp.text
    assert [c["text"] for c in resp.json()["choices"]] == ["t0", "t1"]
    assert resp.headers["x-gateway-provider"] == "alt"
    assert [r.path for r in upstream.received] == ["/v1/completions", "/alt/v1/completions"]


def test_a_first_stream_event_numbered_out_of_range_fails_over_to_the_next_target(
    api: httpx.Client, upstream: Upstream
) -> None:
    good = reply_sse([event(0, "a"), event(1, "b"), event(0, "c", "stop"), event(1, "d", "stop"), b"data: [DONE]"])
    upstream.handler = by_path(reply_sse([event(5, "evil"), event(0, "x", "stop"), b"data: [DONE]"]), good)
    body = {"model": "pair", "prompt": "p", "max_tokens": 3, "n": 2, "stream": True}
    resp = api.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    chunks = [json.loads(d) for d in sse_data(resp.text) if d != "[DONE]"]
    assert [c["choices"][0]["text"] for c in chunks] == ["a", "b", "c", "d"]
    assert "evil" not in resp.text


def test_a_first_chat_stream_event_numbered_past_n_fails_before_the_first_byte(
    api: httpx.Client, upstream: Upstream
) -> None:
    upstream.handler = reply_sse([chat_event(1, "evil"), chat_event(0, "a", "stop"), b"data: [DONE]"])
    body = {"model": "oa/m", "messages": [{"role": "user", "content": "p"}], "stream": True}
    resp = api.post("/v1/chat/completions", json=body)
    assert resp.status_code == 502, resp.text
    assert resp.json()["error"]["code"] == "invalid_upstream_response"


TOKENS = ["hello", " world", " STOP", " more"]
# More stops than OpenAI takes (4): the gateway enforces them itself and cuts the answer at " STOP".
STOPS = {"stop": [" STOP", "a1", "a2", "a3", "a4"]}


def legacy(logprobs: dict[str, Any]) -> bytes:
    choice = {"text": "".join(TOKENS), "index": 0, "logprobs": logprobs, "finish_reason": "length"}
    usage = {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}
    body = {"id": "x", "object": "text_completion", "created": 1, "model": "m", "choices": [choice], "usage": usage}
    return json.dumps(body).encode()


def lists(token_logprobs: int = 4, top: int | None = 4, offsets: int = 4) -> dict[str, Any]:
    return {
        "tokens": TOKENS,
        "token_logprobs": [-1.0] * token_logprobs,
        "top_logprobs": None if top is None else [{"x": -2.0}] * top,
        "text_offset": [0, 5, 11, 16][:offsets],
    }


@pytest.mark.parametrize("extra", [STOPS, {}], ids=["stops-enforced", "plain"])
@pytest.mark.parametrize(
    "logprobs",
    [lists(token_logprobs=1), lists(token_logprobs=9), lists(top=1), lists(top=7)],
    ids=["fewer-logprobs", "more-logprobs", "fewer-tops", "more-tops"],
)
def test_logprobs_lists_of_other_lengths_are_an_unreadable_answer(
    api: httpx.Client, upstream: Upstream, logprobs: dict[str, Any], extra: dict[str, Any]
) -> None:
    upstream.handler = reply(legacy(logprobs))
    resp = api.post("/v1/completions", json={"model": "oa/m", "prompt": "p", "max_tokens": 4, "logprobs": 1, **extra})
    assert resp.status_code == 502, resp.text
    assert resp.json()["error"]["code"] == "invalid_upstream_response"


@pytest.mark.parametrize(
    "logprobs", [lists(), lists(top=None), lists(offsets=1)], ids=["whole", "no-alternatives", "offsets-recounted"]
)
def test_aligned_lists_are_cut_at_the_stop_the_gateway_enforces(
    api: httpx.Client, upstream: Upstream, logprobs: dict[str, Any]
) -> None:
    upstream.handler = reply(legacy(logprobs))
    body = {"model": "oa/m", "prompt": "p", "max_tokens": 4, "logprobs": 1, **STOPS}
    resp = api.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("hello world", "stop")
    assert choice["logprobs"]["tokens"] == ["hello", " world"]
    assert choice["logprobs"]["token_logprobs"] == [-1.0, -1.0]


def gemini(steps: int) -> bytes:
    chosen = [{"token": t, "logProbability": -1.0} for t in TOKENS]
    top = [{"candidates": [{"token": "x", "logProbability": -2.0}]}] * steps
    candidate = {
        "content": {"parts": [{"text": "".join(TOKENS)}], "role": "model"},
        "finishReason": "STOP",
        "logprobsResult": {"chosenCandidates": chosen, "topCandidates": top},
    }
    usage = {"promptTokenCount": 1, "candidatesTokenCount": 4, "totalTokenCount": 5}
    return json.dumps({"candidates": [candidate], "usageMetadata": usage}).encode()


@pytest.mark.parametrize(("steps", "status"), [(4, 200), (1, 502), (6, 502)])
def test_gemini_top_candidates_are_a_step_each(api: httpx.Client, upstream: Upstream, steps: int, status: int) -> None:
    upstream.handler = reply(gemini(steps))
    # Gemini takes 5 stop sequences: with six the gateway enforces them and cuts the logprobs.
    stops = {"stop": [*STOPS["stop"], "a5"]}
    resp = api.post("/v1/completions", json={"model": "gn/m", "prompt": "p", "max_tokens": 4, "logprobs": 1, **stops})
    assert resp.status_code == status, resp.text
    if status == 200:
        assert resp.json()["choices"][0]["logprobs"]["tokens"] == ["hello", " world"]


def chat_with(logprobs: dict[str, Any]) -> bytes:
    """A chat answer whose logprobs come in the legacy shape (Together's chat route sends this one)."""
    message = {"role": "assistant", "content": "".join(TOKENS)}
    choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": "length"}
    usage = {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}
    body = {"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": [choice], "usage": usage}
    return json.dumps(body).encode()


CHAT_LOGPROBS = {"messages": [{"role": "user", "content": "p"}], "logprobs": True, "top_logprobs": 1}


@pytest.mark.parametrize(
    ("logprobs", "status"),
    [(lists(), 200), (lists(top=None), 200), (lists(token_logprobs=1), 502), (lists(top=7), 502)],
    ids=["whole", "no-alternatives", "fewer-logprobs", "more-tops"],
)
def test_chat_logprobs_in_the_legacy_shape_are_a_position_each(
    api: httpx.Client, upstream: Upstream, logprobs: dict[str, Any], status: int
) -> None:
    upstream.handler = reply(chat_with(logprobs))
    resp = api.post("/v1/chat/completions", json={"model": "oa/m", **CHAT_LOGPROBS})
    assert resp.status_code == status, resp.text
    if status == 200:
        content = resp.json()["choices"][0]["logprobs"]["content"]
        assert [c["token"] for c in content] == TOKENS


@pytest.mark.parametrize(("steps", "status"), [(4, 200), (0, 200), (1, 502), (6, 502)])
def test_gemini_chat_top_candidates_are_a_step_each(
    api: httpx.Client, upstream: Upstream, steps: int, status: int
) -> None:
    upstream.handler = reply(gemini(steps))
    resp = api.post("/v1/chat/completions", json={"model": "gn/m", **CHAT_LOGPROBS})
    assert resp.status_code == status, resp.text
    if status == 200:
        content = resp.json()["choices"][0]["logprobs"]["content"]
        assert [c["token"] for c in content] == TOKENS
        assert [len(c["top_logprobs"]) for c in content] == [1 if steps else 0] * 4
