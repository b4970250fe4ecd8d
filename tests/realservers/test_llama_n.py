"""`n` on a real llama-server with three slots (`-np 3`): in one call where the provider sets `max_n` (the server
evaluates the prompt once and makes each completion in a slot of its own), fanned out one call per choice
where it does not, and above `max_n`. The server's `/metrics` counts the prompt tokens it evaluated.

Providers of the gateway: `one` (llamacpp, `max_n: 3`), `fan` (llamacpp, no `max_n`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.helpers.servers import GatewayThread, serve_config

from .conftest import MODEL, Server, running_llama_server

TOKENS = 6
SLOTS = 3


@pytest.fixture(scope="module")
def slotted(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_llama_server(tiny_model, tmp_path_factory.mktemp("logs"), SLOTS, "--metrics") as server:
        yield server


@pytest.fixture(scope="module")
def gw(slotted: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    config = f"""
server: {{host: 127.0.0.1, port: 0}}
providers:
  one: {{kind: llamacpp, base_url: "{slotted.url}", max_n: {SLOTS}}}
  fan: {{kind: llamacpp, base_url: "{slotted.url}"}}
"""
    with serve_config(tmp_path_factory.mktemp("gw"), config) as g:
        yield g


def _evaluated(client: httpx.Client, server: Server) -> int:
    """The prompt tokens the server has evaluated so far (its cached tokens are not counted)."""
    text = client.get(server.url + "/metrics").text
    found = re.search(r"^llamacpp:prompt_tokens_total (\d+)", text, re.MULTILINE)
    assert found is not None, text[:500]
    return int(found.group(1))


def _greedy(client: httpx.Client, server: Server, prompt: str) -> dict[str, Any]:
    resp = client.post(server.url + "/completion", json={"prompt": prompt, "n_predict": TOKENS, "temperature": 0})
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def test_n_in_one_call_evaluates_the_prompt_once(client: httpx.Client, gw: GatewayThread, slotted: Server) -> None:
    prompt = "a prompt no other test sends, one call"
    before = _evaluated(client, slotted)
    sdk = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)
    out = sdk.completions.create(model=f"one/{MODEL}", prompt=prompt, n=SLOTS, max_tokens=TOKENS, temperature=0)
    evaluated = _evaluated(client, slotted) - before
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage is not None
    # Greedy: each slot answers what the server answers alone.
    direct = _greedy(client, slotted, prompt)
    # The prompt evaluated once (a token a slot held from an earlier prompt is not evaluated again) and counted
    # once, as the server counts it; every completion's tokens added.
    assert 0 < evaluated <= out.usage.prompt_tokens == direct["tokens_evaluated"]
    assert out.usage.completion_tokens == SLOTS * TOKENS
    assert [c.text for c in out.choices] == [direct["content"]] * SLOTS
    assert {c.finish_reason for c in out.choices} == {"length"}


def test_n_fanned_out_without_max_n(client: httpx.Client, gw: GatewayThread, slotted: Server) -> None:
    prompt = "another prompt no other test sends, fanned out"
    body = {"model": f"fan/{MODEL}", "prompt": prompt, "n": 2, "max_tokens": TOKENS, "temperature": 0}
    resp = client.post(gw.url + "/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    direct = _greedy(client, slotted, prompt)
    assert [c["text"] for c in out["choices"]] == [direct["content"]] * 2
    # One call per choice: each evaluated the prompt, and the usage counts it twice.
    assert out["usage"]["prompt_tokens"] == 2 * direct["tokens_evaluated"]
    assert [c["index"] for c in out["choices"]] == [0, 1]


def test_n_above_max_n_is_fanned_out(client: httpx.Client, gw: GatewayThread) -> None:
    body = {"model": f"one/{MODEL}", "prompt": "more than the slots", "n": SLOTS + 2, "max_tokens": TOKENS}
    resp = client.post(gw.url + "/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert [c["index"] for c in out["choices"]] == list(range(SLOTS + 2))
    assert out["usage"]["completion_tokens"] == (SLOTS + 2) * TOKENS


def test_a_stream_of_n_in_one_call(client: httpx.Client, gw: GatewayThread, slotted: Server) -> None:
    prompt = "a streamed prompt no other test sends"
    body = {
        "model": f"one/{MODEL}",
        "prompt": prompt,
        "n": SLOTS,
        "max_tokens": TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    before = _evaluated(client, slotted)
    with client.stream("POST", gw.url + "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        text = resp.read().decode()
    evaluated = _evaluated(client, slotted) - before
    events = [line.removeprefix("data: ") for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = {i: "" for i in range(SLOTS)}
    finished: dict[int, str] = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            texts[c["index"]] += c["text"]
            if c["finish_reason"] is not None:
                finished[c["index"]] = c["finish_reason"]
    direct = _greedy(client, slotted, prompt)
    assert texts == {i: direct["content"] for i in range(SLOTS)}
    assert finished == {i: "length" for i in range(SLOTS)}
    usage = chunks[-1]["usage"]
    assert 0 < evaluated <= usage["prompt_tokens"] == direct["tokens_evaluated"]
    assert usage["completion_tokens"] == SLOTS * TOKENS


@pytest.mark.parametrize("field", ["n_cmpl", "n", "max_completion_tokens"])
def test_extra_params_may_not_set_the_counts_the_server_reads(
    client: httpx.Client, gw: GatewayThread, field: str
) -> None:
    # llama-server reads `n` as `n_cmpl` and `max_completion_tokens` as `n_predict`: a tenant setting them through
    # `inference_extra_params` would get more than admission reserved for.
    for provider in ("one", "fan"):
        body = {"model": f"{provider}/{MODEL}", "prompt": "x", "inference_extra_params": {field: 3}}
        resp = client.post(gw.url + "/v1/completions", json=body)
        assert resp.status_code == 400, resp.text
        # `n` and the token limits are refused for every provider; the rest by the kind's own paths.
        assert resp.json()["error"]["param"] in ("inference_extra_params", f"inference_extra_params.{field}")
        assert field in resp.json()["error"]["message"]


@pytest.mark.parametrize("field", ["n_cmpl", "n_predict"])
def test_chat_extra_params_may_not_set_them_either(client: httpx.Client, gw: GatewayThread, field: str) -> None:
    body = {
        "model": f"one/{MODEL}",
        "messages": [{"role": "user", "content": "hi"}],
        "inference_extra_params": {field: 3},
    }
    resp = client.post(gw.url + "/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == f"inference_extra_params.{field}"


def test_best_of_in_one_call_keeps_the_likeliest(client: httpx.Client, gw: GatewayThread, slotted: Server) -> None:
    # best_of's candidates are n_cmpl's completions where they fit in max_n: the prompt evaluated once, each
    # candidate's tokens counted, the one with the highest mean token log-probability answered.
    prompt = "a best_of prompt no other test sends"
    before = _evaluated(client, slotted)
    body = {"model": f"one/{MODEL}", "prompt": prompt, "best_of": SLOTS, "max_tokens": TOKENS, "seed": 7}
    resp = client.post(gw.url + "/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    evaluated = _evaluated(client, slotted) - before
    out = resp.json()
    direct = _greedy(client, slotted, prompt)
    assert len(out["choices"]) == 1 and out["choices"][0]["logprobs"] is None  # not asked for: not shown
    assert 0 < evaluated <= out["usage"]["prompt_tokens"] == direct["tokens_evaluated"]
    assert out["usage"]["completion_tokens"] == SLOTS * TOKENS
    # The same candidates asked for directly: the answer is the likeliest of them.
    raw = client.post(
        slotted.url + "/completion",
        json={"prompt": prompt, "n_predict": TOKENS, "n_cmpl": SLOTS, "seed": 7, "n_probs": 1, "cache_prompt": True},
    )
    assert raw.status_code == 200, raw.text

    def mean(result: dict[str, Any]) -> float:
        lps = [float(p["logprob"]) for p in result["completion_probabilities"]]
        return sum(lps) / len(lps)

    best = max(raw.json(), key=mean)
    assert out["choices"][0]["text"] == best["content"]


def test_best_of_beyond_max_n_is_a_call_per_candidate(client: httpx.Client, gw: GatewayThread, slotted: Server) -> None:
    prompt = "a wide best_of prompt no other test sends"
    body = {"model": f"one/{MODEL}", "prompt": prompt, "best_of": SLOTS + 1, "max_tokens": TOKENS}
    resp = client.post(gw.url + "/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    direct = _greedy(client, slotted, prompt)
    assert resp.json()["usage"]["prompt_tokens"] == (SLOTS + 1) * direct["tokens_evaluated"]
