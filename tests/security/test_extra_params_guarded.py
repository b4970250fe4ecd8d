"""`inference_extra_params` cannot set the token limit, a choice count or the prompt under the provider's own
names (llama.cpp's `n_predict`, TGI's `parameters.max_new_tokens`): over real sockets, the gateway under
uvicorn with a token limit on each provider, loopback upstreams counting what they receive. A refused
request never leaves the gateway; other native fields still pass."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers.clients import client
from tests.helpers.recordings import fixture_bytes
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream, reply

CONFIG = """
retries: {{attempts: 1}}
keys:
  - {{name: team-a, key: k-a}}
  - {{name: team-b, key: k-b}}
providers:
  llama: {{kind: llamacpp, base_url: "{llama}", limits: {{tpm: 1000}}}}
  hf: {{kind: tgi, base_url: "{tgi}", limits: {{tpm: 1000}}}}
"""
LLAMA_ANSWER = json.dumps(
    {"content": " fine", "stop": True, "stop_type": "eos", "tokens_evaluated": 2, "tokens_predicted": 1}
).encode()


@pytest.fixture(scope="module")
def llama() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def tgi() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def gw(llama: Upstream, tgi: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    cfg = CONFIG.format(llama=llama.url, tgi=tgi.url)
    with serve_config(tmp_path_factory.mktemp("extra-guarded"), cfg) as g:
        yield g


@pytest.fixture
def g(gw: GatewayThread, llama: Upstream, tgi: Upstream) -> GatewayThread:
    llama.reset()
    llama.handler = reply(LLAMA_ANSWER)
    tgi.reset()
    tgi.handler = reply(fixture_bytes("tgi/generate_details_length.json"))
    return gw


def post(gw: GatewayThread, key: str, payload: dict[str, Any]) -> httpx.Response:
    with client(gw.url, key) as c:
        return c.post("/v1/completions", json=payload)


def _refused(resp: httpx.Response, path: str) -> None:
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert (err["type"], err["param"], err["code"]) == (
        "invalid_request_error",
        f"inference_extra_params.{path}",
        "invalid_value",
    )
    assert f"may not set '{path}'" in err["message"]


@pytest.mark.parametrize("n_predict", [-1, 100_000])
def test_llamacpp_n_predict_cannot_lift_the_reserved_limit(g: GatewayThread, llama: Upstream, n_predict: int) -> None:
    # max_tokens 10 fits tpm 1000; n_predict -1 (unbounded) or 100000 would not have.
    resp = post(
        g,
        "k-a",
        {"model": "llama/m", "prompt": "hi", "max_tokens": 10, "inference_extra_params": {"n_predict": n_predict}},
    )
    _refused(resp, "n_predict")
    assert llama.received == []


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ({"parameters": {"max_new_tokens": 100_000}}, "parameters.max_new_tokens"),
        ({"parameters": {"best_of": 8}}, "parameters.best_of"),
        ({"inputs": "a prompt the token estimate never saw"}, "inputs"),
    ],
)
def test_tgi_native_limit_count_and_prompt_are_refused(
    g: GatewayThread, tgi: Upstream, extra: dict[str, Any], path: str
) -> None:
    resp = post(g, "k-b", {"model": "hf/m", "prompt": "hi", "max_tokens": 10, "inference_extra_params": extra})
    _refused(resp, path)
    assert tgi.received == []


def test_other_native_fields_still_reach_the_upstream(g: GatewayThread, llama: Upstream, tgi: Upstream) -> None:
    extra = {"n_keep": 4, "parameters": {"decoder_input_details": False}}
    for model in ("llama/m", "hf/m"):
        resp = post(g, "k-a", {"model": model, "prompt": "hi", "max_tokens": 10, "inference_extra_params": extra})
        assert resp.status_code == 200, resp.text
    sent_llama, sent_tgi = llama.only().json(), tgi.only().json()
    assert (sent_llama["n_keep"], sent_llama["n_predict"]) == (4, 10)
    assert sent_tgi["parameters"]["decoder_input_details"] is False
    assert sent_tgi["parameters"]["max_new_tokens"] == 10
