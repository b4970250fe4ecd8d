"""DeepSeek FIM `/beta/completions`: no n/best_of/seed/logit_bias/user; suffix and echo; logprobs up to 20.

No recorded DeepSeek response exists (fixtures/INDEX.md). The blank-line padding DeepSeek documents for
waiting non-stream responses is checked on the real OpenAI-shaped recording with that padding applied.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from providers.base import CallContext, Endpoint, map_params
from providers.deepseek import DeepSeekAdapter
from tests.helpers.adapters import build, context, request
from tests.helpers.recordings import fixture_bytes
from wire.errors import UnsupportedParamError, UpstreamStatusError

ADAPTER = DeepSeekAdapter()
ENDPOINT = Endpoint(
    provider="deepseek", model="deepseek-chat", base_url=DeepSeekAdapter.default_base_url or "", api_key="ds"
)


def test_fim_request() -> None:
    req = request(
        "deepseek/deepseek-chat",
        "def fib(a):",
        suffix="    return fib(a-1) + fib(a-2)",
        max_tokens=128,
        temperature=0.0,
        top_p=1.0,
        stop=["\n\n"],
        echo=False,
        logprobs=True,
        top_logprobs=20,
        frequency_penalty=0.0,
        presence_penalty=0.0,
    )
    up, body, _ = build(ADAPTER, req, ENDPOINT)
    assert up.url == "https://api.deepseek.com/beta/completions"
    assert up.headers == {
        "content-type": "application/json",
        "accept": "application/json",
        "authorization": "Bearer ds",
    }
    assert body == {
        "model": "deepseek-chat",
        "prompt": "def fib(a):",
        "max_tokens": 128,
        "temperature": 0.0,
        "top_p": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "stop": ["\n\n"],
        "logprobs": 20,
        "echo": False,
        "suffix": "    return fib(a-1) + fib(a-2)",
    }


@pytest.mark.parametrize(
    "field,value", [("n", 2), ("best_of", 2), ("seed", 1), ("logit_bias", {"1": 1.0}), ("user", "u")]
)
def test_refused_fields(field: str, value: Any) -> None:
    with pytest.raises(UnsupportedParamError) as info:
        build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert info.value.param == field
    assert info.value.message == f"Parameter '{field}' is not supported by provider 'deepseek'"


def test_n_dropped_under_drop_policy() -> None:
    params, dropped = map_params(request(n=3, max_tokens=5), ADAPTER.params, "deepseek", drop_unsupported=True)
    assert dropped == ["n"]
    assert params == {"max_tokens": 5}


def test_blank_line_padding_before_the_body_is_tolerated() -> None:
    padded = b"\n\n\n" + fixture_bytes("openai/completion_davinci002.json")
    out = ADAPTER.parse_response(padded, context())
    assert out.choices[0].text == "-go library\nS-dmssea 2020-08-13: How"
    assert out.usage is not None and out.usage.total_tokens == 24


# DeepSeek's own words (its FinishReason enum and usage fields, api-docs.deepseek.com), on the recorded
# completion's shape: no DeepSeek answer carrying them was recorded.
def test_a_generation_cut_short_for_lack_of_resources_is_a_failure_not_an_answer() -> None:
    recorded = json.loads(fixture_bytes("openai/completion_davinci002.json"))
    recorded["choices"][0]["finish_reason"] = "insufficient_system_resource"
    body = json.dumps(recorded).encode()
    for parse in (ADAPTER.parse_response, lambda b, ctx: ADAPTER.parse_event(None, b, ctx)):
        with pytest.raises(UpstreamStatusError) as info:
            parse(body, context(["x"]))
        assert (info.value.code, info.value.status, info.value.retryable) == ("generation_error", 502, True)
        assert "insufficient_system_resource" in info.value.message
    ctx = CallContext(id="chatcmpl-d", created=1, model="deepseek/x", chat=True)
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunk["choices"] = [{"index": 0, "delta": {}, "finish_reason": "insufficient_system_resource"}]
    with pytest.raises(UpstreamStatusError):
        ADAPTER.parse_chat_event(None, json.dumps(chunk).encode(), ctx)


def test_prompt_cache_hits_are_cached_tokens() -> None:
    recorded = json.loads(fixture_bytes("openai/completion_davinci002.json"))
    recorded["usage"] = {
        "prompt_tokens": 100,
        "completion_tokens": 50,
        "total_tokens": 150,
        "prompt_cache_hit_tokens": 80,
        "prompt_cache_miss_tokens": 20,
    }
    usage = ADAPTER.parse_response(json.dumps(recorded).encode(), context(["x"])).usage
    assert usage is not None and usage.prompt_tokens == 100
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 80
