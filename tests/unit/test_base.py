"""providers.base: the Param table mechanics, map_params (refuse or drop), prompt forms, capability checks."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import ConfigError, parse_config
from providers import REGISTRY
from providers.base import PARAM_FIELDS, Param, map_params, prompt_form, stop_list, table
from providers.guarded import ExtraMerge, merge_extra
from providers.openai import OpenAIAdapter
from providers.openai_compat import OPENAI_PARAMS
from providers.pais import PAISAdapter
from tests.helpers.adapters import request
from wire.errors import UnsupportedParamError


def test_param_fields_exclude_gateway_and_alias_fields() -> None:
    excluded = {
        "model",
        "prompt",
        "stream",
        "stream_options",
        "inference_timeout",
        "inference_extra_params",
        "inference_extra_headers",
        "max_new_tokens",
        "max_completion_tokens",
        "stop_sequences",
        "top_logprobs",
        "return_token_log_probs",
    }
    assert not excluded & set(PARAM_FIELDS)
    assert {"max_tokens", "stop", "logprobs", "guided_json", "tools"} <= set(PARAM_FIELDS)


def test_param_write_forms() -> None:
    body: dict[str, Any] = {}
    Param().write(body, "max_tokens", 5)
    Param("options.num_predict").write(body, "max_tokens", 6)
    Param("options.stop", convert=stop_list).write(body, "stop", "x")
    Param(apply=lambda b, v: b.update({"applied": v * 2})).write(body, "n", 2)
    assert body == {"max_tokens": 5, "options": {"num_predict": 6, "stop": ["x"]}, "applied": 4}


def test_table_builds_on_a_base_and_rejects_unknown_fields() -> None:
    t = table(OPENAI_PARAMS, drop=("best_of",), top_k=Param())
    assert "best_of" not in t and "top_k" in t and "max_tokens" in t
    with pytest.raises(ValueError, match=r"table names fields the request does not have: \['max_new_tokens'\]"):
        table(max_new_tokens=Param())


def test_map_params_refuses_the_first_unsupported_field_in_field_order() -> None:
    req = request(top_k=3, guided_regex="a", max_tokens=2)
    with pytest.raises(UnsupportedParamError) as info:
        map_params(req, OPENAI_PARAMS, "prov", drop_unsupported=False)
    assert info.value.param == "top_k"
    assert info.value.message == "Parameter 'top_k' is not supported by provider 'prov'"
    assert (info.value.status, info.value.code, info.value.type) == (
        400,
        "unsupported_parameter",
        "invalid_request_error",
    )


def test_map_params_drop_returns_the_dropped_names() -> None:
    req = request(top_k=3, guided_regex="a", max_tokens=2, images=["x"], stop="s")
    body, dropped = map_params(req, OPENAI_PARAMS, "prov", drop_unsupported=True)
    assert dropped == ["top_k", "guided_regex", "images"]
    assert body == {"max_tokens": 2, "stop": ["s"]}


def test_map_params_skips_unset_and_keeps_falsy_values() -> None:
    req = request(temperature=0.0, echo=False, logprobs=0, max_tokens=0)
    body, dropped = map_params(req, OPENAI_PARAMS, "prov", drop_unsupported=False)
    assert body == {"max_tokens": 0, "temperature": 0.0, "logprobs": 0, "echo": False}
    assert dropped == []
    assert map_params(request(), OPENAI_PARAMS, "prov", drop_unsupported=False) == ({}, [])


@pytest.mark.parametrize(
    "prompt,form", [("x", "text"), (["x"], "texts"), ([1, 2], "tokens"), ([[1], [2]], "token_lists")]
)
def test_prompt_form(prompt: Any, form: str) -> None:
    assert prompt_form(prompt) == form


def test_check_logprobs_limit_per_kind() -> None:
    limits = {kind: cls.max_logprobs for kind, cls in REGISTRY.items()}
    assert limits == {
        "openai": 5,
        "azure": 5,
        "fireworks": 5,
        "together": 20,
        "vllm": 20,
        "sglang": 20,
        "deepseek": 20,
        "pais": 5,
        "sgp": 20,
        "fake": 20,
        "anthropic": 0,
        "cohere": 0,
        "gemini": 20,
        "mistral": 5,
        "tgi": 5,
        "ollama": 20,
        "llamacpp": 20,
        "bedrock": 0,
    }
    # Over a provider's count: refused by the check, naming the limit.
    with pytest.raises(UnsupportedParamError) as info:
        OpenAIAdapter().check(request(logprobs=True, top_logprobs=6), "openai")
    assert (info.value.param, info.value.message) == (
        "logprobs",
        "Provider 'openai' returns at most 5 logprobs, got 6",
    )
    # A provider without logprobs at all passes the check; its table refuses the field by name.
    pais = PAISAdapter()
    req = request(logprobs=True, top_logprobs=6)
    pais.check(req, "pais")
    with pytest.raises(UnsupportedParamError) as info:
        map_params(req, pais.params, "pais", drop_unsupported=False)
    assert (info.value.param, info.value.message) == (
        "logprobs",
        "Parameter 'logprobs' is not supported by provider 'pais'",
    )


def test_config_accepts_exactly_the_registered_kinds() -> None:
    # The config has no list of kinds of its own: it takes every registered one and names them all otherwise.
    for kind, cls in REGISTRY.items():
        extra = "base_url: http://h, " if cls.needs_base_url else "region: us-east-1, " if cls.needs_region else ""
        assert parse_config(f"providers: {{x: {{kind: {kind}, {extra}api_key: k}}}}").providers["x"].kind == kind
    with pytest.raises(ConfigError) as info:
        parse_config("providers: {x: {kind: opnai}}")
    assert str(info.value).endswith(f"valid kinds: {', '.join(sorted(REGISTRY))}")


@pytest.mark.parametrize(
    ("how", "merged"),
    [
        ("top", {"options": {"b": {"y": 2}}, "k": 1}),
        ("nested", {"options": {"a": 1, "b": {"y": 2}}, "k": 1}),
        ("deep", {"options": {"a": 1, "b": {"x": 1, "y": 2}}, "k": 1}),
    ],
)
def test_extra_params_merge_as_the_kind_declares(how: ExtraMerge, merged: dict[str, Any]) -> None:
    body: dict[str, Any] = {"options": {"a": 1, "b": {"x": 1}}}
    merge_extra(body, {"options": {"b": {"y": 2}}, "k": 1}, how)
    assert body == merged
    assert {cls.extra_params for cls in REGISTRY.values()} == {"top", "nested", "deep"}
