"""LangChain's `OpenAI` LLM (langchain-openai, the legacy Completions client) pointed at the gateway.

invoke, batch (one request with a list of prompts), stream, stop and logprobs, against the keyless fake
provider and a vLLM server (the loopback `VLLMLike`), over real sockets. LangChain sends its own defaults
(`temperature`, `top_p`, penalties, `n`, `seed: null`, `logprobs: null`...): the gateway takes them as they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langchain_core.language_models import LanguageModelInput
from langchain_openai import OpenAI
from pydantic import SecretStr

from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream

from .conftest import CLIENTS_KEY, LOCAL

MODELS = [pytest.param("demo/text", id="fake"), pytest.param(LOCAL, id="vllm")]
PROMPTS = ["Say this is a test", "the cat sat", "Question: 2 + 2 =\nAnswer:"]


@pytest.fixture
def http_client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=15) as client:
        yield client


def _llm(gateway: GatewayThread, http_client: httpx.Client, model: str, **kwargs: Any) -> OpenAI:
    return OpenAI(
        model=model,
        base_url=gateway.url + "/v1",
        api_key=SecretStr(CLIENTS_KEY),
        max_retries=0,
        max_tokens=12,
        temperature=0,
        http_client=http_client,
        **kwargs,
    )


def _direct(api: httpx.Client, model: str, prompt: str, **fields: Any) -> dict[str, Any]:
    resp = api.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 12, **fields})
    assert resp.status_code == 200, resp.text
    choice: dict[str, Any] = resp.json()["choices"][0]
    return choice


@pytest.mark.parametrize("model", MODELS)
def test_invoke(gateway: GatewayThread, http_client: httpx.Client, api: httpx.Client, model: str) -> None:
    text = _llm(gateway, http_client, model).invoke(PROMPTS[0])
    assert text and text == _direct(api, model, PROMPTS[0])["text"]


@pytest.mark.parametrize("model", MODELS)
def test_batch_is_one_request_answered_in_order(
    gateway: GatewayThread, http_client: httpx.Client, api: httpx.Client, upstream: Upstream, model: str
) -> None:
    texts = _llm(gateway, http_client, model).batch(list[LanguageModelInput](PROMPTS))
    if model == LOCAL:
        assert upstream.only().json()["prompt"] == PROMPTS
    assert texts == [_direct(api, model, p)["text"] for p in PROMPTS]
    assert len(set(texts)) == len(PROMPTS)


@pytest.mark.parametrize("model", MODELS)
def test_stream_concatenates_to_the_answer(
    gateway: GatewayThread, http_client: httpx.Client, api: httpx.Client, model: str
) -> None:
    pieces = list(_llm(gateway, http_client, model).stream(PROMPTS[1]))
    assert len(pieces) > 1
    assert "".join(pieces) == _direct(api, model, PROMPTS[1])["text"]


@pytest.mark.parametrize("model", MODELS)
def test_stop(gateway: GatewayThread, http_client: httpx.Client, api: httpx.Client, model: str) -> None:
    full = _direct(api, model, PROMPTS[2])["text"]
    stop = full[len(full) // 2 :].split()[0]
    text = _llm(gateway, http_client, model).invoke(PROMPTS[2], stop=[stop])
    assert text == full[: full.find(stop)]


@pytest.mark.parametrize("model", MODELS)
def test_logprobs_in_generation_info(gateway: GatewayThread, http_client: httpx.Client, model: str) -> None:
    result = _llm(gateway, http_client, model, logprobs=2).generate([PROMPTS[0]])
    generation = result.generations[0][0]
    assert generation.generation_info is not None
    lp = generation.generation_info["logprobs"]
    assert "".join(lp["tokens"]) == generation.text
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    # OpenAI's offsets: the continuation starts right after the prompt, whichever provider answered.
    assert lp["text_offset"][0] == len(PROMPTS[0])
    assert all(len(top) >= 2 for top in lp["top_logprobs"])


def test_logprobs_ten_from_vllm(gateway: GatewayThread, http_client: httpx.Client) -> None:
    """The issue's `OpenAI(logprobs=10)`: vLLM returns up to 20, so the gateway must not cap it at OpenAI's 5."""
    result = _llm(gateway, http_client, LOCAL, logprobs=10).generate([PROMPTS[0]])
    info = result.generations[0][0].generation_info
    assert info is not None and all(len(top) >= 10 for top in info["logprobs"]["top_logprobs"])
