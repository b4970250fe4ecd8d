"""Item 6 of issue 11 for the native providers: each one's own error shape inside a `200`.

Before the fix, Anthropic's `{"type": "error", ...}`, Mistral's `{"object": "error", ...}`, TGI's and
Ollama's `{"error": "..."}` and llama.cpp's `{"error": {...}}` answered with status 200 reached the
client as a successful empty completion (and Bedrock's `{"__type": ...}` as a 502 never retried).
Each is now an upstream error with the status its words mean, retried or not as that status says.
Over real sockets: the gateway served by uvicorn, one aiohttp loopback upstream answering every path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream, reply, reply_sse

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 2, initial_backoff_ms: 1, max_backoff_ms: 2}}
cooldown: {{base_ms: 1, max_ms: 2}}
providers:
  claude: {{kind: anthropic, api_key: ak-test-0000000000, base_url: "{u}"}}
  mistral: {{kind: mistral, api_key: mk-test-0000000000, base_url: "{u}"}}
  tgi: {{kind: tgi, base_url: "{u}"}}
  ollama: {{kind: ollama, base_url: "{u}"}}
  llama: {{kind: llamacpp, base_url: "{u}"}}
  llamas: {{kind: llamacpp, base_url: "{u}", max_n: 4}}
  gemini: {{kind: gemini, api_key: gk-test-0000000000, base_url: "{u}"}}
  bedrock: {{kind: bedrock, api_key: "AKIAIOSFODNN7EXAMPLE:secret0000000000000000", region: us-east-1, base_url: "{u}"}}
"""


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    with serve_config(tmp_path_factory.mktemp("native-envelopes"), CONFIG.format(u=upstream.url)) as gw:
        yield gw


def envelope(body: object) -> bytes:
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("model", "body", "status", "calls"),
    [
        pytest.param(
            "claude/claude-3-5-haiku-latest",
            envelope({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            502,
            2,
            id="anthropic-overloaded-retried",
        ),
        pytest.param(
            "claude/claude-3-5-haiku-latest",
            envelope({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too big"}}),
            400,
            1,
            id="anthropic-invalid-request",
        ),
        pytest.param(
            "mistral/mistral-small-latest",
            envelope({"object": "error", "message": "Rate limit exceeded", "type": "rate_limited", "code": "1300"}),
            429,
            2,
            id="mistral-rate-limited",
        ),
        pytest.param(
            "tgi/bigscience/bloom",
            envelope({"error": "Model is overloaded", "error_type": "overloaded"}),
            429,
            2,
            id="tgi-overloaded",
        ),
        pytest.param(
            "ollama/llama3.2",
            envelope({"error": "model requires more system memory than is available"}),
            502,
            2,
            id="ollama-error",
        ),
        pytest.param(
            "llama/any",
            envelope({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}),
            502,
            2,
            id="llamacpp-loading",
        ),
        pytest.param(
            "bedrock/anthropic.claude-3-haiku-20240307-v1:0",
            envelope({"message": "Too many requests, please wait", "__type": "ThrottlingException"}),
            429,
            2,
            id="bedrock-throttled",
        ),
    ],
)
def test_native_error_envelope_in_a_200_is_an_upstream_error(
    gateway: GatewayThread, upstream: Upstream, model: str, body: bytes, status: int, calls: int
) -> None:
    upstream.reset()
    gateway.pipeline.health.reset()
    upstream.handler = reply(body, status=200)
    with httpx.Client(trust_env=False, timeout=15) as client:
        resp = client.post(gateway.url + "/v1/completions", json={"model": model, "prompt": "x"})
    assert resp.status_code == status, resp.text
    assert "error" in resp.json()
    assert len(upstream.received) == calls


def _result(**fields: object) -> dict[str, object]:
    return {"content": "ok", "stop": True, "stop_type": "limit", "tokens_evaluated": 3, "tokens_predicted": 1} | fields


@pytest.mark.parametrize(
    ("body", "status"),
    [
        pytest.param(b"[]", 502, id="no-result"),
        pytest.param(b"[1, 2]", 502, id="not-results"),
        pytest.param(b"[" + b'{"content": "x"},' * 3 + b"]", 502, id="broken-json"),
        pytest.param(envelope([_result(), {"error": {"code": 500, "message": "boom"}}]), 502, id="an-error-inside"),
        pytest.param(envelope([_result(index=-7), _result(index=1)]), 502, id="a-negative-index"),
        pytest.param(envelope([_result(index=0), _result(index=2**40)]), 502, id="an-index-beyond-n"),
        pytest.param(envelope([_result(index=i) for i in range(5_000)]), 502, id="more-than-asked"),
        # Two completions in any order answer `n: 2` in one call; to one of the calls a choice each (no `max_n`)
        # they are one choice more than asked for.
        pytest.param(envelope([_result(index=1), _result(index=0)]), (502, 200), id="in-any-order"),
    ],
)
@pytest.mark.parametrize("provider", ["llama", "llamas"])
def test_a_llama_servers_array_of_results_never_crashes_the_gateway(
    gateway: GatewayThread, upstream: Upstream, body: bytes, status: int | tuple[int, int], provider: str
) -> None:
    # The array is what a llama-server answers for several completions of one prompt (`n_cmpl`); any server may
    # send one, asked or not. Whatever it holds, the client gets an answer or an upstream error, never a 500.
    if isinstance(status, tuple):
        status = status[provider == "llamas"]
    upstream.reset()
    gateway.pipeline.health.reset()
    upstream.handler = reply(body, status=200)
    with httpx.Client(trust_env=False, timeout=15) as client:
        resp = client.post(gateway.url + "/v1/completions", json={"model": f"{provider}/any", "prompt": "x", "n": 2})
        assert resp.status_code == status, resp.text
        assert client.get(gateway.url + "/health").status_code == 200
    # `n` in one call where the provider sets `max_n`, one call per choice where it does not (an error inside is
    # retried: twice as many calls). A fan-out that fails cancels its other call, which may not have been sent yet.
    sent = [r.json().get("n_cmpl") for r in upstream.received]
    tries = 2 if "error" in body.decode() else 1
    if provider == "llamas":
        assert sent == [2] * tries
    else:
        assert set(sent) == {None} and (len(sent) == 2 if status == 200 else 1 <= len(sent) <= 2 * tries)


@pytest.mark.parametrize("stops", [None, ["zz", "yy"]])
@pytest.mark.parametrize("logprobs", [None, 1])
@pytest.mark.parametrize("odd", [None, -3, 2, 2**40])
def test_a_llama_servers_stream_of_odd_indexes_never_crashes_the_gateway(
    gateway: GatewayThread, upstream: Upstream, stops: list[str] | None, logprobs: int | None, odd: int | None
) -> None:
    # An event of a result the request never asked for (a negative index, one beyond n) fails the answer before
    # anything is relayed; results interleaved and a result's final event twice are relayed. Never a 500 or a
    # hang, with probabilities and with stops the gateway scans for.
    prob = {"id": 5, "token": "a", "bytes": [97], "logprob": -0.5, "top_logprobs": []}
    events = [
        {"index": 1, "content": "a", "stop": False, "completion_probabilities": [prob]},
        {"index": 0, "content": "b", "stop": False, "completion_probabilities": [prob]},
        _result(index=1, content=""),
        _result(index=1, content=""),
        _result(index=0, content="c", completion_probabilities=[prob]),
    ]
    if odd is not None:
        events.insert(0, {"index": odd, "content": "a", "stop": False, "completion_probabilities": [prob]})
    upstream.reset()
    gateway.pipeline.health.reset()
    upstream.handler = reply_sse([b"data: " + envelope(e) for e in events])
    body: dict[str, object] = {"model": "llamas/any", "prompt": "x", "n": 2, "stream": True, "stop": stops}
    if logprobs is not None:
        body["logprobs"] = logprobs
    with httpx.Client(trust_env=False, timeout=15) as client:
        with client.stream("POST", gateway.url + "/v1/completions", json=body) as resp:
            text = resp.read().decode()
        if odd is None:
            assert resp.status_code == 200, text
            chunks = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]
            got = {i: "".join(c["text"] for k in chunks for c in k["choices"] if c["index"] == i) for i in (0, 1)}
            assert got == {0: "bc", 1: "a"}
            assert text.rstrip().endswith("data: [DONE]")
        else:
            assert resp.status_code == 502, text
            assert resp.json()["error"]["code"] == "invalid_upstream_response"
        assert client.get(gateway.url + "/health").status_code == 200


def test_a_llama_server_that_ignores_n_is_an_error_not_one_choice(gateway: GatewayThread, upstream: Upstream) -> None:
    # A llama-server older than `n_cmpl` answers one completion however many were asked for.
    upstream.reset()
    gateway.pipeline.health.reset()
    upstream.handler = reply(envelope(_result()), status=200)
    with httpx.Client(trust_env=False, timeout=15) as client:
        resp = client.post(gateway.url + "/v1/completions", json={"model": "llamas/any", "prompt": "x", "n": 2})
        assert resp.status_code == 502, resp.text
        assert (resp.json()["error"]["code"], resp.json()["error"]["param"]) == ("upstream_ignored_n", "n")
        fanned = client.post(gateway.url + "/v1/completions", json={"model": "llama/any", "prompt": "x", "n": 2})
        assert fanned.status_code == 200, fanned.text
        assert [c["index"] for c in fanned.json()["choices"]] == [0, 1]
