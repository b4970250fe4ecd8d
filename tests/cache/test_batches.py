"""Lists of prompts are cached per prompt: a partly stored batch asks the upstream only for the rest."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.helpers.clients import sse_data
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream

from .conftest import MODEL

TEXTS = ["batch: the cat", "batch: sat on", "batch: a mat"]
IDS = [[14582, 25, 1867], [464, 3797, 3332, 319], [40, 588, 11, 257, 9]]


def body(prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 1, **extra}


@pytest.mark.parametrize("prompts", [TEXTS, IDS], ids=["texts", "token-ids"])
def test_a_partly_cached_batch_sends_only_the_missing_prompts(
    alice: httpx.Client, upstream: Upstream, prompts: list[Any]
) -> None:
    a, b, c = prompts
    fresh = alice.post("/v1/completions", json=body([b, c, a]), headers={"cache-control": "no-store"}).json()
    upstream.received.clear()
    assert alice.post("/v1/completions", json=body([a, b])).headers["x-gateway-cache"] == "miss"
    partial = alice.post("/v1/completions", json=body([b, c, a]))
    assert partial.status_code == 200, partial.text
    assert partial.headers["x-gateway-cache"] == "miss"
    assert [r.json()["prompt"] for r in upstream.received] == [[a, b], [c]]
    got = partial.json()
    # In prompt order, numbered prompt_index x n + j, each the answer its prompt gets on its own.
    assert [ch["index"] for ch in got["choices"]] == [0, 1, 2]
    for mine, want in zip(got["choices"], fresh["choices"], strict=True):
        assert (mine["text"], mine["logprobs"], mine["finish_reason"]) == (
            want["text"],
            want["logprobs"],
            want["finish_reason"],
        )
    if prompts is IDS:  # token-id prompts: each prompt's share of the prompt tokens is exact
        assert got["usage"]["prompt_tokens"] == fresh["usage"]["prompt_tokens"]
    rerun = alice.post("/v1/completions", json=body([b, c, a]))
    assert rerun.headers["x-gateway-cache"] == "hit"
    assert rerun.json()["choices"] == got["choices"] and rerun.json()["usage"] == got["usage"]
    assert len(upstream.received) == 2


def test_a_whole_batch_rerun_reports_the_upstream_usage(alice: httpx.Client, upstream: Upstream) -> None:
    first = alice.post("/v1/completions", json=body(["sum: " + t for t in TEXTS]))
    again = alice.post("/v1/completions", json=body(["sum: " + t for t in TEXTS]))
    assert again.headers["x-gateway-cache"] == "hit"
    assert again.json()["usage"] == first.json()["usage"]
    assert len(upstream.received) == 1


def test_a_streamed_batch_is_served_from_entries_its_prompts_stored_apart(
    alice: httpx.Client, upstream: Upstream
) -> None:
    prompts = ["apart: " + t for t in TEXTS[:2]]
    singles = [alice.post("/v1/completions", json=body(p)).json() for p in prompts]
    resp = alice.post("/v1/completions", json=body(prompts, stream=True))
    assert resp.headers["x-gateway-cache"] == "hit"
    events = [json.loads(e) for e in sse_data(resp.text)[:-1]]
    texts = {0: "", 1: ""}
    for e in events:
        for ch in e["choices"]:
            texts[ch["index"]] += ch["text"]
    assert [texts[0], texts[1]] == [s["choices"][0]["text"] for s in singles]
    assert len(upstream.received) == 2


def test_a_partly_cached_streamed_batch_streams_only_the_missing_prompts(
    alice: httpx.Client, upstream: Upstream
) -> None:
    a, b, c = ("spliced: " + t for t in TEXTS)
    fresh = alice.post("/v1/completions", json=body([b, c, a]), headers={"cache-control": "no-store"}).json()
    alice.post("/v1/completions", json=body([a, b]))
    upstream.received.clear()
    payload = body([b, c, a], stream=True, stream_options={"include_usage": True})
    resp = alice.post("/v1/completions", json=payload)
    assert resp.status_code == 200 and resp.headers["x-gateway-cache"] == "miss"
    assert [r.json()["prompt"] for r in upstream.received] == [[c]]
    events = sse_data(resp.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts: dict[int, str] = {}
    for chunk in chunks:
        for ch in chunk["choices"]:
            texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
    assert texts == {ch["index"]: ch["text"] for ch in fresh["choices"]}
    usage = [chunk["usage"] for chunk in chunks if chunk.get("usage")]
    assert len(usage) == 1 and usage[0]["prompt_tokens"] == fresh["usage"]["prompt_tokens"]
    # c's chunks were stored as they streamed: the whole batch is now a hit.
    again = alice.post("/v1/completions", json=payload)
    assert again.headers["x-gateway-cache"] == "hit"
    assert len(upstream.received) == 1


def test_a_batch_whose_keys_would_repeat_a_large_field_is_not_cached(
    alice: httpx.Client, upstream: Upstream, gateway: GatewayThread
) -> None:
    # Each prompt's key holds the whole request but the other prompts: 128 keys of a 40 KB field pass the
    # bound on their sum (`BATCH_KEYS_BYTES`), two do not.
    field = {"bound": "F" * 40_000}
    many = body([f"bound {i}" for i in range(128)], inference_extra_params=field)
    for _ in range(2):
        r = alice.post("/v1/completions", json=many)
        assert r.status_code == 200, r.text
        assert r.headers["x-gateway-cache"] == "bypass"
        assert len(r.json()["choices"]) == 128
    assert len(upstream.received) == 2
    refused = alice.post("/v1/completions", json=many, headers={"cache-control": "only-if-cached"})
    assert refused.status_code == 504
    cache = gateway.pipeline.cache
    assert cache is not None
    before = cache.memory.size()[1]
    two = body(["bound a", "bound b"], inference_extra_params=field)
    assert alice.post("/v1/completions", json=two).headers["x-gateway-cache"] == "miss"
    assert alice.post("/v1/completions", json=two).headers["x-gateway-cache"] == "hit"
    # The two entries' keys (40 KB each) count in the store's bound, beside answers of a few hundred bytes.
    assert cache.memory.size()[1] - before > 2 * 40_000


def test_a_batchs_keys_hold_a_large_field_once_not_again_in_its_token_count(
    alice: httpx.Client, upstream: Upstream, gateway: GatewayThread
) -> None:
    # What a completion sends beside its prompts is counted for its limits (`unrendered`), a copy made from
    # its fields: the keys hold the fields alone. 64 keys of a 40 KB field (2.6 MB) pass `BATCH_KEYS_BYTES`,
    # which keys holding it twice (5.1 MB) would not.
    field = {"once": "O" * 40_000}
    many = body([f"once {i}" for i in range(64)], inference_extra_params=field)
    cache = gateway.pipeline.cache
    assert cache is not None
    before = cache.memory.size()[1]
    first = alice.post("/v1/completions", json=many)
    assert first.status_code == 200, first.text
    assert first.headers["x-gateway-cache"] == "miss"
    assert alice.post("/v1/completions", json=many).headers["x-gateway-cache"] == "hit"
    assert len(upstream.received) == 1
    # 64 entries, each key about 40 KB beside an answer of a few hundred bytes.
    assert 64 * 40_000 < cache.memory.size()[1] - before < 64 * 50_000
