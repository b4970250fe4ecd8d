"""The built-in fake provider as clients use it: echo, errors, slow and drip, n x prompts, logprobs, stop."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.helpers.clients import async_openai_client
from tests.helpers.errors import ALL_ROUTES, SGP_ROUTE, assert_error
from tests.helpers.servers import GatewayThread

from .conftest import FULL_KEY


def test_echo_through_the_sdk(oai: openai.OpenAI) -> None:
    completion = oai.completions.create(model="demo/echo", prompt="The quick brown fox")
    assert completion.model == "demo/echo"
    assert completion.object == "text_completion"
    assert [(c.index, c.text, c.finish_reason) for c in completion.choices] == [(0, "The quick brown fox", "stop")]
    assert completion.usage is not None
    assert completion.usage.model_dump(exclude_none=True) == {
        "prompt_tokens": 4,
        "completion_tokens": 4,
        "total_tokens": 8,
    }


def test_echo_honours_max_tokens_and_stop(oai: openai.OpenAI) -> None:
    prompt = "one two three four five"
    cut = oai.completions.create(model="demo/echo", prompt=prompt, max_tokens=2)
    assert (cut.choices[0].text, cut.choices[0].finish_reason) == ("one two", "length")
    stopped = oai.completions.create(model="demo/echo", prompt=prompt, stop=[" four", "zzz"])
    assert (stopped.choices[0].text, stopped.choices[0].finish_reason) == ("one two three", "stop")
    kept = oai.completions.create(
        model="demo/echo", prompt=prompt, stop=" four", extra_body={"include_stop_str_in_output": True}
    )
    assert (kept.choices[0].text, kept.choices[0].finish_reason) == ("one two three four", "stop")


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_multi_prompt_times_n_indexing(api: httpx.Client, route: str) -> None:
    prompts = ["a b", "c d e"]
    resp = api.post(route, json={"model": "demo/echo", "prompt": prompts, "n": 3})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    # choice index = prompt_index * n + j
    assert [(c["index"], c["text"]) for c in body["choices"]] == [
        (0, "a b"),
        (1, "a b"),
        (2, "a b"),
        (3, "c d e"),
        (4, "c d e"),
        (5, "c d e"),
    ]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 15, "total_tokens": 20}


def test_multi_prompt_distinct_choices_per_j(oai: openai.OpenAI) -> None:
    completion = oai.completions.create(model="demo/text", prompt=["first", "second"], n=2, seed=3)
    assert [c.index for c in completion.choices] == [0, 1, 2, 3]
    texts = [c.text for c in completion.choices]
    assert len(set(texts)) == 4  # each (prompt, j) pair is generated separately
    again = oai.completions.create(model="demo/text", prompt=["first", "second"], n=2, seed=3)
    assert [c.text for c in again.choices] == texts  # deterministic
    other = oai.completions.create(model="demo/text", prompt=["first", "second"], n=2, seed=4)
    assert [c.text for c in other.choices] != texts


def test_token_id_prompts(oai: openai.OpenAI) -> None:
    completion = oai.completions.create(model="demo/echo", prompt=[[101, 7592], [2088]])
    assert [(c.index, c.text) for c in completion.choices] == [(0, "101 7592"), (1, "2088")]


def test_logprobs_integer_count(oai: openai.OpenAI) -> None:
    prompt = "Once upon a time"
    completion = oai.completions.create(model="demo/text", prompt=prompt, logprobs=2, max_tokens=5)
    (choice,) = completion.choices
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None and lp.text_offset is not None
    assert lp.token_logprobs is not None and lp.top_logprobs is not None
    assert "".join(lp.tokens) == choice.text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    # OpenAI's offsets count into prompt + completion.
    assert lp.text_offset[0] == len(prompt)
    for i in range(1, 5):
        assert lp.text_offset[i] == lp.text_offset[i - 1] + len(lp.tokens[i - 1])
    for token, top in zip(lp.tokens, lp.top_logprobs, strict=True):
        assert len(top) == 2
        assert token in top


def test_boolean_logprobs_with_top_logprobs_on_the_sgp_route(api: httpx.Client) -> None:
    resp = api.post(
        SGP_ROUTE,
        json={"model": "demo/text", "prompt": "x", "logprobs": True, "top_logprobs": 20, "max_new_tokens": 3},
    )
    assert resp.status_code == 200, resp.text
    lp = resp.json()["choices"][0]["logprobs"]
    assert [len(top) for top in lp["top_logprobs"]] == [20, 20, 20]


def test_return_token_log_probs_gives_token_logprobs_without_alternatives(api: httpx.Client) -> None:
    resp = api.post(
        SGP_ROUTE, json={"model": "demo/text", "prompt": "x", "return_token_log_probs": True, "max_new_tokens": 4}
    )
    assert resp.status_code == 200, resp.text
    lp = resp.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == 4
    assert lp["top_logprobs"] is None


def test_long_runs_to_max_tokens(api: httpx.Client) -> None:
    body = api.post("/v1/completions", json={"model": "demo/long", "prompt": "x", "max_tokens": 7}).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 7
    assert len(body["choices"][0]["text"].split()) == 7


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize("stream", [False, True])
def test_error_429_model(api: httpx.Client, route: str, stream: bool) -> None:
    resp = api.post(route, json={"model": "demo/error-429", "prompt": "x", "stream": stream})
    assert resp.headers["retry-after"] == "1"
    assert_error(
        resp,
        route,
        status=429,
        type="rate_limit_error",
        message="demo error (429): fake failure requested by model name",
        code="upstream_http_429",
    )


def test_error_429_through_the_sdk(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        oai.completions.create(model="demo/error-429", prompt="x")
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "1"
    assert info.value.message == "Error code: 429 - demo error (429): fake failure requested by model name"
    assert info.value.body == {
        "message": "demo error (429): fake failure requested by model name",
        "type": "rate_limit_error",
        "param": None,
        "code": "upstream_http_429",
    }


@pytest.mark.parametrize(
    ("model", "status", "type"),
    [
        ("demo/error-500", 502, "upstream_error"),
        ("demo/error-400", 400, "invalid_request_error"),
        ("demo/error-504", 504, "timeout_error"),
    ],
)
def test_error_models_map_like_upstream_statuses(api: httpx.Client, model: str, status: int, type: str) -> None:
    resp = api.post("/v1/completions", json={"model": model, "prompt": "x"})
    code = model.rsplit("-", 1)[1]
    assert_error(
        resp,
        "/v1/completions",
        status=status,
        type=type,
        message=f"demo error ({code}): fake failure requested by model name",
        code=f"upstream_http_{code}",
    )


def test_slow_model_waits(oai: openai.OpenAI) -> None:
    started = time.monotonic()
    completion = oai.completions.create(model="demo/slow-300ms", prompt="x")
    assert time.monotonic() - started >= 0.3
    assert completion.choices[0].finish_reason in ("stop", "length")


async def test_slow_requests_do_not_block_each_other(gateway: GatewayThread) -> None:
    async with async_openai_client(gateway.url + "/v1", FULL_KEY) as client:
        started = time.monotonic()
        results = await asyncio.gather(
            *(client.completions.create(model="demo/slow-400ms", prompt=f"p{i}") for i in range(6))
        )
        elapsed = time.monotonic() - started
    assert [r.model for r in results] == ["demo/slow-400ms"] * 6
    assert 0.4 <= elapsed < 2.0, elapsed  # concurrent, not 6 x 0.4 s = 2.4 s


def test_drip_model_streams_token_by_token(oai: openai.OpenAI) -> None:
    arrivals: list[float] = []
    texts: list[str] = []
    with oai.completions.create(model="demo/drip-40ms", prompt="x", max_tokens=6, stream=True) as stream:
        for chunk in stream:
            arrivals.append(time.monotonic())
            texts.append(chunk.choices[0].text)
    assert len(texts) == 6
    # Each token leaves the gateway when it is produced: the first arrives well before the last.
    assert arrivals[-1] - arrivals[0] >= 5 * 0.04 * 0.75, arrivals
    whole = oai.completions.create(model="demo/text", prompt="x", max_tokens=6)
    assert "".join(texts) == whole.choices[0].text  # drip only changes the pace, not the text


async def test_drip_stream_through_the_async_sdk(gateway: GatewayThread) -> None:
    async with async_openai_client(gateway.url + "/v1", FULL_KEY) as client:
        stream = await client.completions.create(
            model="demo/drip-10ms", prompt="x", max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
    assert [len(c.choices) for c in chunks] == [1, 1, 1, 1, 0]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4
    assert chunks[3].choices[0].finish_reason == "length"


def test_alias_routes_to_the_fake(api: httpx.Client) -> None:
    resp = api.post("/v1/completions", json={"model": "fast", "prompt": "x", "seed": 1})
    direct = api.post("/v1/completions", json={"model": "demo/text", "prompt": "x", "seed": 1})
    assert resp.json()["model"] == "fast"
    assert resp.json()["choices"] == direct.json()["choices"]


@pytest.mark.parametrize(
    ("route", "body", "named"),
    [
        (SGP_ROUTE, {"prompt": "x", "max_new_tokens": 5000}, "max_new_tokens"),
        (SGP_ROUTE, {"prompt": "x", "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 5000}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "logprobs": 50}, "logprobs"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 5000},
            "max_completion_tokens",
        ),
    ],
)
def test_a_refusal_after_the_fields_are_folded_names_the_field_as_sent(
    api: httpx.Client, route: str, body: dict[str, object], named: str
) -> None:
    """The checks after the dialects' synonyms are folded into one field name the field the client wrote."""
    resp = api.post(route, json={"model": "demo/text", **body})
    assert resp.status_code in (400, 422), resp.text
    if route == SGP_ROUTE:
        (detail,) = resp.json()["detail"]
        assert detail["loc"] == ["body", named]
    else:
        assert resp.json()["error"]["param"] == named
