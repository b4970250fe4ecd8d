"""Issue 11, item 14: the work and memory one request can make the gateway spend are bounded.

Over real sockets (the gateway under uvicorn; Ollama-shaped loopback upstream for the emulated fan-out):
- `demo/long` built its text quadratically on the event loop (51 s for `max_tokens: 80000` on main);
  it is now linear, and beyond `caps.fake_max_tokens` (4096) a 400 names `max_tokens`;
- the fake provider's tokenizer (`\\s*\\S+` with findall) was quadratic in a prompt of white space;
- emulated `echo` x `n` with a 1 MB prompt built hundreds of MB (RSS 725 MB on main); the copies are
  now counted before any upstream call and beyond `caps.emulated_answer_bytes` a 400 names `n`.
"""

from __future__ import annotations

import gc
from typing import Any

import httpx

from tests.helpers.clients import sse_data
from tests.helpers.upstreams import Upstream

from .conftest import HealthProbe, answering, rss_bytes, timed_post


def _error(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 400, resp.text[:500]
    error: dict[str, Any] = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


def test_long_beyond_the_cap_is_a_400_naming_max_tokens(api: httpx.Client) -> None:
    resp, took = timed_post(api, "/v1/completions", {"model": "demo/long", "prompt": "go", "max_tokens": 80000})
    error = _error(resp)
    assert (error["param"], error["code"]) == ("max_tokens", "invalid_value")
    assert error["message"] == "'max_tokens' is 80000, but model 'long' generates at most 4096 tokens per choice"
    assert took < 1.0


def test_long_at_the_cap_is_fast_and_the_loop_keeps_answering(gateway: Any, api: httpx.Client) -> None:
    with HealthProbe(gateway.url) as probe:
        resp, took = timed_post(api, "/v1/completions", {"model": "demo/long", "prompt": "go", "max_tokens": 4096})
    assert resp.status_code == 200, resp.text[:500]
    body = resp.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4096
    assert took < 1.0, took
    assert probe.slowest < 0.5, probe.slowest


def test_long_stream_at_the_cap_lets_the_loop_run(gateway: Any, api: httpx.Client) -> None:
    body = {"model": "demo/long", "prompt": "go", "max_tokens": 4096, "n": 8, "stream": True}
    with HealthProbe(gateway.url) as probe:
        resp, took = timed_post(api, "/v1/completions", body)
    assert resp.status_code == 200
    events = sse_data(resp.text)
    assert events[-1] == "[DONE]" and len(events) > 8 * 4096
    assert took < 10.0, took
    assert probe.slowest < 0.5, probe.slowest


def test_stop_sequences_are_still_honoured_by_the_linear_fake(api: httpx.Client) -> None:
    resp, _ = timed_post(
        api,
        "/v1/completions",
        {"model": "demo/long", "prompt": "go", "max_tokens": 4096, "stop": [" fox"], "logprobs": 1},
    )
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert " fox" not in choice["text"]
    assert "".join(choice["logprobs"]["tokens"]) == choice["text"]


def test_a_prompt_of_white_space_is_tokenized_in_linear_time(api: httpx.Client) -> None:
    # `\s*\S+` retried the run from each of its positions: 40,000 spaces took 10 s on main.
    resp, took = timed_post(api, "/v1/completions", {"model": "demo/echo", "prompt": "start" + " " * 200_000})
    assert resp.status_code == 200, resp.text[:500]
    assert resp.json()["choices"][0]["text"] == "start"
    assert took < 1.0, took


def test_echo_times_n_with_a_1mb_prompt_is_refused_before_any_upstream_call(
    api: httpx.Client,
    upstream: Upstream,
) -> None:
    upstream.handler = answering("ok")
    prompt = "word " * 200_000  # 1 MB
    gc.collect()
    before = rss_bytes()
    resp, took = timed_post(
        api, "/v1/completions", {"model": "ollama/llama3", "prompt": prompt, "echo": True, "n": 128, "max_tokens": 1}
    )
    grew = rss_bytes() - before
    error = _error(resp)
    assert (error["param"], error["code"]) == ("n", "invalid_value")
    assert "at most 16777216 are allowed" in error["message"]
    assert upstream.received == []
    assert grew < 64 * 1024 * 1024, grew
    assert took < 2.0, took


def test_best_of_fan_out_with_a_large_prompt_is_refused_naming_best_of(
    api: httpx.Client,
    upstream: Upstream,
) -> None:
    upstream.handler = answering("ok")
    body = {"model": "ollama/llama3", "prompt": "word " * 200_000, "best_of": 20, "logprobs": 1, "max_tokens": 1}
    resp, _ = timed_post(api, "/v1/completions", body)
    assert _error(resp)["param"] == "best_of"
    assert upstream.received == []


def test_echo_times_n_within_the_cap_still_works(api: httpx.Client, upstream: Upstream) -> None:
    upstream.handler = answering(" ok")
    resp, _ = timed_post(
        api, "/v1/completions", {"model": "ollama/llama3", "prompt": "hello", "echo": True, "n": 3, "max_tokens": 1}
    )
    assert resp.status_code == 200, resp.text
    assert [c["text"] for c in resp.json()["choices"]] == ["hello ok"] * 3
    assert len(upstream.received) == 3


def test_the_fake_refuses_an_answer_beyond_the_cap_naming_n(api: httpx.Client) -> None:
    body = {"model": "demo/echo", "prompt": "word " * 200_000, "echo": True, "n": 64}
    resp, took = timed_post(api, "/v1/completions", body)
    assert _error(resp)["param"] == "n"
    assert took < 1.0


def test_an_emulated_stop_longer_than_pattern_chars_is_refused(
    api: httpx.Client,
    upstream: Upstream,
) -> None:
    body = {
        "model": "ollama/llama3",
        "prompt": "hi",
        "stop": ["x" * 5000],
        "include_stop_str_in_output": True,
        "max_tokens": 4,
    }
    resp, _ = timed_post(api, "/v1/completions", body)
    error = _error(resp)
    assert error["param"] == "stop"
    assert error["code"] == "invalid_value"
    assert upstream.received == []
