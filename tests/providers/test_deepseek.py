"""DeepSeek FIM `/beta/completions`: no n/best_of/seed/logit_bias/user; suffix and echo; logprobs up to 20.

No recorded DeepSeek response exists (fixtures/INDEX.md). The blank-line padding DeepSeek documents for
waiting non-stream responses is checked on the real OpenAI-shaped recording with that padding applied.
"""

from __future__ import annotations

from typing import Any

import pytest

from providers.base import Endpoint, map_params
from providers.deepseek import DeepSeekAdapter
from tests.helpers.adapters import build, context, request
from tests.helpers.recordings import fixture_bytes
from wire.errors import UnsupportedParamError

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
