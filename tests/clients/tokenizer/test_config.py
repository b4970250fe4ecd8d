"""The tokenizer routes' config, and what the llama.cpp servers' own routes make of it."""

from __future__ import annotations

import httpx
import pytest

from gateway.config import ConfigError, parse_config
from gateway.edge import tokenizer_routes
from tests.clients.tokenizer.upstreams import error_envelope
from tests.helpers.upstreams import Upstream

# -- config -------------------------------------------------------------------------------------------------------


def test_config_refuses_an_unroutable_default_and_a_bad_tokenizer_url() -> None:
    base = "providers: {vl: {kind: vllm, base_url: 'http://h/v1'}}\n"
    with pytest.raises(ConfigError, match=r"tokenizer\.default_model"):
        parse_config(base + "tokenizer: {default_model: nope/x}\n", env={})
    with pytest.raises(ConfigError, match=r"providers\.vl\.tokenizer_url"):
        parse_config("providers: {vl: {kind: vllm, base_url: 'http://h/v1', tokenizer_url: 'h/x'}}\n", env={})
    assert parse_config(base + "tokenizer: {default_model: vl/m}\n", env={}).config.tokenizer.default_model == "vl/m"


def test_llamacpp_tokenizer_info_is_built_from_props(api: httpx.Client, upstream: Upstream) -> None:
    info = api.get("/m/ll/tiny/tokenizer_info")
    assert info.status_code == 200, info.text
    assert info.json() == {
        "tokenizer_class": "llama.cpp",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "chat_template": "{{ messages }}",
        "model_max_length": 4096,
    }
    assert [(r.method, r.path) for r in upstream.received] == [("GET", "/ll/props")]


def test_tokenizer_info_takes_the_model_from_the_query(api: httpx.Client, upstream: Upstream) -> None:
    info = api.get("/tokenizer_info", params={"model": "ll/tiny"})
    assert info.status_code == 200, info.text
    assert info.json()["eos_token"] == "</s>"
    assert info.headers["x-gateway-provider"] == "ll"


def test_tokenizer_info_without_a_model_says_how_to_name_it_on_a_get() -> None:
    # This module's gateway has a default model; the words are the ones its refusal uses without one.
    assert "?model=" in str(tokenizer_routes._model_missing("tokenizer_info"))
    assert "send 'model'" in str(tokenizer_routes._model_missing("tokenize"))


def test_an_empty_tokenization_of_text_is_an_upstream_error(api: httpx.Client, upstream: Upstream) -> None:
    resp = api.post("/m/lv/tiny/tokenize", json={"prompt": "hello"})
    assert resp.status_code == 502, resp.text
    assert resp.json()["error"]["code"] == "invalid_upstream_response"
    assert upstream.only().json()["prompt"] == "hello"  # vLLM's field, which llama-server does not read


def test_llama_servers_404_for_a_route_it_lacks_is_tokenizer_not_available(api: httpx.Client) -> None:
    message = error_envelope(api.get("/m/lv/tiny/tokenizer_info"), 404, "tokenizer_not_available")
    assert "'lv'" in message
