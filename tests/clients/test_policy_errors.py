"""What the official openai SDK makes of the gateway's error answers, over real sockets.

An upstream "model does not exist" (vLLM's 404) is a 404 `model_not_found` in every dialect, so the SDK
raises NotFoundError, not BadRequestError. An error the gateway has already retried says
`x-should-retry: false`, so an SDK with `max_retries=2` sends it once and raises at once; one whose
wait the gateway could not afford says `true` with that wait, and the SDK's retry wins.

The gateway is the real app under uvicorn on a loopback port; upstreams are scripted loopback servers
(tests/helpers/faults.py) answering recorded bodies (tests/fixtures/SOURCES.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.helpers.errors import ALL_ROUTES, assert_error
from tests.helpers.faults import FaultServer, rate_limited, respond, server_error
from tests.helpers.recordings import fixture_bytes
from tests.helpers.servers import GatewayThread, serve_config

VLLM_404 = "vllm/error_404_model_not_found.json"
VLLM_404_NESTED = "vllm/error_404_model_not_found.nested.json"
# A vLLM served under a name the request does not use; the gateway sends the route's model name.
MODEL = "local/meta-llama/Llama-3.1-8B-Instruct"


def config(faults: FaultServer) -> str:
    return f"""
server: {{host: 127.0.0.1, port: 0}}
logging: {{requests: false}}
timeouts: {{connect_ms: 1000, first_byte_ms: 5000, total_ms: 10000}}
cooldown: {{base_ms: 50, max_ms: 2000, min_requests: 1}}
providers:
  local: {{kind: vllm, base_url: {faults["local"].base_url}}}
  solo: {{kind: openai, api_key: sk-solo, base_url: {faults["solo"].base_url}}}
models:
  # Two upstream calls per request, little backoff, a 1 s budget: what the SDK sees after them.
  - name: solo
    targets: [{{model: solo/davinci-002}}]
    retries: {{attempts: 2, initial_backoff_ms: 5, max_backoff_ms: 10, budget_ms: 1000}}
"""


@pytest.fixture(scope="module")
def faults() -> Iterator[FaultServer]:
    with FaultServer() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(faults: FaultServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("policy-errors"), config(faults)) as gw:
        yield gw


@pytest.fixture(autouse=True)
def fresh(faults: FaultServer, gateway: GatewayThread) -> None:
    """Every test starts with unscripted targets, an empty journal and no cooldowns."""
    faults.forget()
    gateway.pipeline.health.reset()


class Counted:
    """The official SDK with its default retries (2), counting the requests it sends the gateway."""

    def __init__(self, gateway: GatewayThread) -> None:
        self.sent: list[httpx.Request] = []
        self.client = openai.OpenAI(
            base_url=f"{gateway.url}/v1",
            api_key="sk-anything",  # no keys configured: the gateway is open
            max_retries=2,
            timeout=15,
            http_client=openai.DefaultHttpxClient(trust_env=False, event_hooks={"request": [self.sent.append]}),
        )

    def create(self, model: str) -> Any:
        return self.client.completions.create(model=model, prompt="Tell me a joke", max_tokens=16)


@pytest.fixture
def sdk(gateway: GatewayThread) -> Iterator[Counted]:
    counted = Counted(gateway)
    try:
        yield counted
    finally:
        counted.client.close()


# --------------------------------------------------------------------------------------------------
# An upstream that does not serve the model


@pytest.mark.parametrize("recording", [VLLM_404, VLLM_404_NESTED], ids=["vllm-flat", "vllm-nested"])
def test_vllm_model_does_not_exist_raises_not_found_in_the_sdk(
    faults: FaultServer, sdk: Counted, recording: str
) -> None:
    faults["local"].script(then=respond(fixture_bytes(recording), 404))
    with pytest.raises(openai.NotFoundError) as info:
        sdk.create(MODEL)
    upstream = json.loads(fixture_bytes(recording))
    message = upstream["message"] if "message" in upstream else upstream["error"]["message"]
    assert info.value.status_code == 404
    assert info.value.body == {
        "message": f"local error (404): {message}",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    assert info.value.response.headers["x-should-retry"] == "false"
    assert len(sdk.sent) == 1 and faults.order() == ["local"]
    # The upstream was asked for the route's model name.
    assert faults["local"].hits[0].json()["model"] == "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_vllm_model_does_not_exist_is_404_in_every_dialect(
    faults: FaultServer, gateway: GatewayThread, route: str
) -> None:
    faults["local"].script(then=respond(fixture_bytes(VLLM_404), 404))
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as client:
        resp = client.post(route, json={"model": MODEL, "prompt": "x"})
    message = "local error (404): The model `meta-llama/Llama-3.1-8B-Instruct` does not exist."
    assert_error(
        resp,
        route,
        status=404,
        type="invalid_request_error",
        param="model",
        code="model_not_found",
        message=message,
        # SGP and PAIS answer an unknown model the way PAIS documents it (gateway/path/dialects.py).
        detail=f"Unknown model endpoint requested. {message}",
    )
    assert resp.headers["x-should-retry"] == "false"


# --------------------------------------------------------------------------------------------------
# x-should-retry


@pytest.mark.parametrize(
    ("fault", "error", "status"),
    [
        pytest.param(server_error(), openai.InternalServerError, 502, id="502"),
        pytest.param(rate_limited(retry_after_ms="20"), openai.RateLimitError, 429, id="429"),
    ],
)
def test_after_the_gateways_retries_the_sdk_asks_once_and_raises_at_once(
    faults: FaultServer, sdk: Counted, fault: Any, error: type[openai.APIStatusError], status: int
) -> None:
    faults["solo"].script(then=fault)
    start = time.monotonic()
    with pytest.raises(error) as info:
        sdk.create("solo")
    took = time.monotonic() - start
    assert info.value.status_code == status
    assert info.value.response.headers["x-should-retry"] == "false"
    assert info.value.response.headers["x-gateway-attempts"] == "2"
    # One request from the SDK; the gateway made its two upstream calls for it.
    assert len(sdk.sent) == 1
    assert faults.order() == ["solo", "solo"]
    # The SDK's first retry would have waited at least 0.375 s (0.5 s less up to 25 % jitter).
    assert took < 0.35


def test_a_wait_beyond_the_gateways_budget_is_the_sdks_to_take(faults: FaultServer, sdk: Counted) -> None:
    # 1.2 s does not fit the alias's 1 s budget: the gateway answers at once, and says the wait is worth it.
    faults["solo"].script(rate_limited(retry_after_ms="1200"))
    start = time.monotonic()
    completion = sdk.create("solo")
    took = time.monotonic() - start
    assert completion.choices[0].text
    assert len(sdk.sent) == 2  # the SDK's one retry, after the upstream's wait
    assert faults.order() == ["solo", "solo"]
    assert took >= 1.2
    gap = faults["solo"].hits[1].at - faults["solo"].hits[0].at
    assert 1.15 <= gap < 3


def test_the_answer_that_invites_the_retry_says_how_long_to_wait(faults: FaultServer, gateway: GatewayThread) -> None:
    faults["solo"].script(rate_limited(retry_after_ms="1200"))
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as client:
        resp = client.post("/v1/completions", json={"model": "solo", "prompt": "x"})
    assert resp.status_code == 429
    assert resp.headers["x-should-retry"] == "true"
    assert resp.headers["retry-after-ms"] == "1200"
    assert resp.headers["retry-after"] == "2"
    assert resp.headers["x-gateway-attempts"] == "1"


def test_a_bad_request_says_do_not_retry(gateway: GatewayThread, faults: FaultServer) -> None:
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as client:
        resp = client.post("/v1/completions", json={"model": "solo", "prompt": "x", "temperature": 7})
    assert resp.status_code == 400
    assert resp.headers["x-should-retry"] == "false"
    assert faults.order() == []


def test_an_unknown_model_says_do_not_retry(gateway: GatewayThread) -> None:
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as client:
        resp = client.post("/v1/completions", json={"model": "nobody/nothing", "prompt": "x"})
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "model_not_found"
    assert resp.headers["x-should-retry"] == "false"
