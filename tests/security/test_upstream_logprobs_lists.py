"""An upstream's logprobs lists must have an entry per token each.

OpenAI's legacy logprobs are parallel lists (`tokens`, `token_logprobs`, `top_logprobs`), and Gemini's
`chosenCandidates` and `topCandidates` a step each. Lists of other lengths reached the client as they came,
and where the gateway cut the answer at a stop sequence it enforces itself, the cut read past a list's end: a
500. Such an answer is now an unreadable one (502 `invalid_upstream_response`, tried elsewhere). Over real
sockets: the gateway served by uvicorn, one aiohttp loopback upstream speaking the OpenAI and Gemini formats.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream, reply

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
providers:
  oa: {{kind: openai, api_key: sk-test-000000000000, base_url: "{u}/v1"}}
  gm: {{kind: gemini, api_key: gk-test-0000000000, base_url: "{u}"}}
"""
TOKENS = ["hello", " world", " STOP", " more"]
# More stops than OpenAI takes (4): the gateway enforces them itself and cuts the answer at " STOP".
STOPS = {"stop": [" STOP", "a1", "a2", "a3", "a4"]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("logprobs-lists"), CONFIG.format(u=upstream.url)) as gw:
        yield gw


@pytest.fixture
def api(gateway: GatewayThread) -> Iterator[httpx.Client]:
    gateway.pipeline.health.reset()
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as client:
        yield client


def completion(logprobs: dict[str, Any]) -> bytes:
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
    upstream.handler = reply(completion(logprobs))
    resp = api.post("/v1/completions", json={"model": "oa/m", "prompt": "p", "max_tokens": 4, "logprobs": 1, **extra})
    assert resp.status_code == 502, resp.text
    assert resp.json()["error"]["code"] == "invalid_upstream_response"


@pytest.mark.parametrize(
    "logprobs", [lists(), lists(top=None), lists(offsets=1)], ids=["whole", "no-alternatives", "offsets-recounted"]
)
def test_aligned_lists_are_cut_at_the_stop_the_gateway_enforces(
    api: httpx.Client, upstream: Upstream, logprobs: dict[str, Any]
) -> None:
    upstream.handler = reply(completion(logprobs))
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
    resp = api.post("/v1/completions", json={"model": "gm/m", "prompt": "p", "max_tokens": 4, "logprobs": 1, **stops})
    assert resp.status_code == status, resp.text
    if status == 200:
        assert resp.json()["choices"][0]["logprobs"]["tokens"] == ["hello", " world"]
