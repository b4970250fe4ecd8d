"""Buffered hits and misses: the key, the scope, the modes, Cache-Control, errors never stored."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from tests.helpers.errors import ALL_ROUTES, OPENAI_ROUTES
from tests.helpers.servers import rewrite, serve_config
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_until

from .conftest import ADMIN, MODEL, client, config


def body(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 5, "temperature": 0, **extra}


def test_a_rerun_is_a_hit_with_the_same_choices_and_no_upstream_call(alice: httpx.Client, upstream: Upstream) -> None:
    first = alice.post("/v1/completions", json=body("rerun: the cat"))
    assert first.status_code == 200, first.text
    assert first.headers["x-gateway-cache"] == "miss"
    second = alice.post("/v1/completions", json=body("rerun: the cat"))
    assert second.status_code == 200, second.text
    assert second.headers["x-gateway-cache"] == "hit"
    assert int(second.headers["age"]) >= 0
    assert second.headers["x-gateway-model"] == MODEL and second.headers["x-gateway-provider"] == "local"
    assert len(upstream.received) == 1
    a, b = first.json(), second.json()
    assert json.dumps(a["choices"]) == json.dumps(b["choices"])
    assert a["usage"] == b["usage"]
    assert b["id"] != a["id"]  # a new answer, made of the stored choices
    # Served from the stored client bytes: its own time, the same model and fields.
    assert b.keys() == a.keys() and b["model"] == a["model"] and b["created"] >= a["created"]


def test_an_integer_past_64_bits_in_a_free_form_field_is_keyed_too(alice: httpx.Client, upstream: Upstream) -> None:
    """The key's binary form has no such integer: the request is keyed by its JSON form instead, and still
    hits, still tells different values apart, and reaches the upstream as the client wrote it."""
    wide = 2**64 + 7
    sent = body("wide: one", inference_extra_params={"salt": wide})
    first = alice.post("/v1/completions", json=sent)
    assert first.status_code == 200, first.text
    assert first.headers["x-gateway-cache"] == "miss"
    assert str(wide).encode() in upstream.received[0].body
    assert alice.post("/v1/completions", json=sent).headers["x-gateway-cache"] == "hit"
    other = body("wide: one", inference_extra_params={"salt": wide + 1})
    assert alice.post("/v1/completions", json=other).headers["x-gateway-cache"] == "miss"
    narrow = body("wide: one", inference_extra_params={"salt": 7})
    assert alice.post("/v1/completions", json=narrow).headers["x-gateway-cache"] == "miss"
    assert len(upstream.received) == 3


def test_field_order_and_dialect_names_do_not_change_the_key(alice: httpx.Client, upstream: Upstream) -> None:
    extra = {"inference_extra_params": {"b": 1, "a": {"y": 2, "z": 3}}, "top_k": 5}
    sent = {"model": MODEL, "prompt": "order: a b", "max_new_tokens": 5, "temperature": 0, **extra}
    assert alice.post("/v1/completions", json=sent).headers["x-gateway-cache"] == "miss"
    reordered = {
        "top_k": 5,
        "temperature": 0.0,
        "inference_extra_params": {"a": {"z": 3, "y": 2}, "b": 1},
        "max_tokens": 5,
        "prompt": "order: a b",
        "model": MODEL,
    }
    again = alice.post("/inference/v1/completions", content=json.dumps(reordered))
    assert again.headers["x-gateway-cache"] == "hit", again.text
    assert len(upstream.received) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"top_k": 7},
        {"inference_extra_params": {"b": 2, "a": {"y": 2, "z": 3}}},
        {"repetition_penalty": 1.1},
        {"max_tokens": 6},
        {"model": "everyone"},
    ],
    ids=["native-field", "extra-params", "sampling-field", "max-tokens", "alias-vs-target"],
)
def test_every_field_that_decides_the_answer_is_in_the_key(
    alice: httpx.Client, upstream: Upstream, change: dict[str, Any]
) -> None:
    base = body("fields: " + next(iter(change)), top_k=5, inference_extra_params={"b": 1, "a": {"y": 2, "z": 3}})
    assert alice.post("/v1/completions", json=base).status_code == 200
    other = alice.post("/v1/completions", json=base | change)
    assert other.status_code == 200, other.text
    assert other.headers["x-gateway-cache"] == "miss"
    assert len(upstream.received) == 2


def test_scope_key_keeps_each_key_to_its_own_entries(
    alice: httpx.Client, bob: httpx.Client, upstream: Upstream
) -> None:
    assert alice.post("/v1/completions", json=body("scope: mine")).headers["x-gateway-cache"] == "miss"
    assert bob.post("/v1/completions", json=body("scope: mine")).headers["x-gateway-cache"] == "miss"
    assert bob.post("/v1/completions", json=body("scope: mine")).headers["x-gateway-cache"] == "hit"
    assert len(upstream.received) == 2


def test_scope_shared_serves_every_key(alice: httpx.Client, bob: httpx.Client, upstream: Upstream) -> None:
    shared = {"model": "everyone", "prompt": "scope: ours", "max_tokens": 5, "temperature": 0.9}
    assert alice.post("/v1/completions", json=shared).headers["x-gateway-cache"] == "miss"
    hit = bob.post("/v1/completions", json=shared)
    assert hit.headers["x-gateway-cache"] == "hit"
    assert hit.headers["x-gateway-model"] == MODEL  # the target that served the stored answer
    assert len(upstream.received) == 1


def test_deterministic_mode_caches_only_what_sampling_cannot_change(alice: httpx.Client, upstream: Upstream) -> None:
    sampled = {"model": MODEL, "prompt": "mode: sampled", "max_tokens": 5, "temperature": 0.8}
    assert alice.post("/v1/completions", json=sampled).headers["x-gateway-cache"] == "bypass"
    assert alice.post("/v1/completions", json=sampled).headers["x-gateway-cache"] == "bypass"
    seeded = sampled | {"seed": 7}
    assert alice.post("/v1/completions", json=seeded).headers["x-gateway-cache"] == "miss"
    assert alice.post("/v1/completions", json=seeded).headers["x-gateway-cache"] == "hit"
    nothing = sampled | {"max_tokens": 0, "echo": True, "logprobs": 1, "prompt": "mode: echo"}
    assert alice.post("/v1/completions", json=nothing).headers["x-gateway-cache"] == "miss"
    assert alice.post("/v1/completions", json=nothing).headers["x-gateway-cache"] == "hit"
    assert len(upstream.received) == 4


def test_a_model_whose_cache_is_off_has_no_cache_header(alice: httpx.Client, upstream: Upstream) -> None:
    off = body("off: x") | {"model": "uncached"}
    for _ in range(2):
        resp = alice.post("/v1/completions", json=off)
        assert resp.status_code == 200 and "x-gateway-cache" not in resp.headers
    assert len(upstream.received) == 2


def test_errors_are_never_stored(alice: httpx.Client, upstream: Upstream) -> None:
    async def failing(request: web.Request, received: Received) -> web.StreamResponse:
        # A client error: it does not cool the target down, so the next request reaches the upstream.
        return web.json_response(
            {"object": "error", "message": "bad", "type": "BadRequestError", "code": 400}, status=400
        )

    like_handler = upstream.handler
    upstream.handler = failing
    assert alice.post("/v1/completions", json=body("errors: x")).status_code == 400
    upstream.handler = like_handler
    resp = alice.post("/v1/completions", json=body("errors: x"))
    assert resp.status_code == 200 and resp.headers["x-gateway-cache"] == "miss"
    assert len(upstream.received) == 2


def test_cache_control_no_cache_asks_the_upstream_and_stores_the_fresh_answer(
    alice: httpx.Client, upstream: Upstream
) -> None:
    assert alice.post("/v1/completions", json=body("cc: no-cache")).headers["x-gateway-cache"] == "miss"
    fresh = alice.post("/v1/completions", json=body("cc: no-cache"), headers={"cache-control": "no-cache"})
    assert fresh.headers["x-gateway-cache"] == "bypass"
    assert len(upstream.received) == 2
    assert alice.post("/v1/completions", json=body("cc: no-cache")).headers["x-gateway-cache"] == "hit"
    assert len(upstream.received) == 2


def test_cache_control_no_store_neither_reads_nor_stores(alice: httpx.Client, upstream: Upstream) -> None:
    for _ in range(2):
        resp = alice.post("/v1/completions", json=body("cc: no-store"), headers={"cache-control": "no-store"})
        assert resp.headers["x-gateway-cache"] == "bypass"
    assert alice.post("/v1/completions", json=body("cc: no-store")).headers["x-gateway-cache"] == "miss"
    assert len(upstream.received) == 3


def test_cache_control_max_age_takes_only_younger_entries(alice: httpx.Client, upstream: Upstream) -> None:
    assert alice.post("/v1/completions", json=body("cc: max-age")).headers["x-gateway-cache"] == "miss"
    young = alice.post("/v1/completions", json=body("cc: max-age"), headers={"cache-control": "max-age=3600"})
    assert young.headers["x-gateway-cache"] == "hit"
    # An entry always has some age, however little: max-age=0 refuses it and asks the upstream.
    old = alice.post("/v1/completions", json=body("cc: max-age"), headers={"cache-control": "max-age=0"})
    assert old.headers["x-gateway-cache"] == "miss"
    assert len(upstream.received) == 2


@pytest.mark.parametrize("route", ALL_ROUTES)
def test_only_if_cached_miss_is_a_504_cache_miss_without_an_upstream_call(
    alice: httpx.Client, upstream: Upstream, route: str
) -> None:
    resp = alice.post(route, json=body("cc: only " + route), headers={"cache-control": "only-if-cached"})
    assert resp.status_code == 504, resp.text
    if route in OPENAI_ROUTES:
        assert resp.json()["error"]["code"] == "cache_miss"
    else:
        assert "only-if-cached" in resp.json()["detail"]
    assert upstream.received == []
    assert alice.post(route, json=body("cc: only " + route)).headers["x-gateway-cache"] == "miss"
    hit = alice.post(route, json=body("cc: only " + route), headers={"cache-control": "only-if-cached"})
    assert hit.status_code == 200 and hit.headers["x-gateway-cache"] == "hit"
    assert len(upstream.received) == 1


def test_admin_can_delete_entries_and_the_status_shows_the_cache(alice: httpx.Client, upstream: Upstream) -> None:
    admin = {"authorization": f"Bearer {ADMIN}"}
    alice.post("/v1/completions", json=body("admin: one"))
    alice.post("/v1/completions", json=body("admin: two") | {"model": "everyone"})
    assert alice.delete("/admin/cache").status_code == 401  # a client key is not the admin key
    status = alice.get("/admin/status", headers=admin).json()["cache"]
    assert status["memory_entries"] >= 2 and status["memory_bytes"] > 0 and status["miss"] >= 2
    gone = alice.delete("/admin/cache", params={"model": "everyone"}, headers=admin)
    assert gone.status_code == 200 and gone.json()["deleted"] >= 1
    again = alice.post("/v1/completions", json=body("admin: two") | {"model": "everyone"})
    assert again.headers["x-gateway-cache"] == "miss"
    assert alice.post("/v1/completions", json=body("admin: one")).headers["x-gateway-cache"] == "hit"
    assert alice.delete("/admin/cache", headers=admin).json()["deleted"] >= 2
    assert alice.post("/v1/completions", json=body("admin: one")).headers["x-gateway-cache"] == "miss"
    metrics = alice.get("/metrics").text
    assert 'gateway_cache_total{model="local/facebook/opt-125m",result="hit"}' in metrics
    # Every stored answer's bytes are counted under its model (a buffered miss's as much as a stream's).
    stored = re.search(r'^gateway_cache_stored_bytes_total\{model="local/facebook/opt-125m"\} (\S+)$', metrics, re.M)
    assert stored is not None and float(stored.group(1)) > 0


def test_the_memory_store_never_exceeds_max_bytes(upstream: Upstream, tmp_path: Path) -> None:
    bounded = config(upstream).replace("cache: {mode: deterministic}", "cache: {mode: deterministic, max_bytes: 2048}")
    with serve_config(tmp_path, bounded) as gw, client(gw.url) as c:
        admin = {"authorization": f"Bearer {ADMIN}"}
        for i in range(12):
            assert c.post("/v1/completions", json=body(f"bound: {i}")).headers["x-gateway-cache"] == "miss"
            cache = c.get("/admin/status", headers=admin).json()["cache"]
            assert 0 < cache["memory_bytes"] <= 2048
        assert cache["evictions"] > 0
        # A full store evicts on every miss; the metric counts each eviction as the status does.
        evicted = re.search(r"^gateway_cache_evictions_total (\S+)$", c.get("/metrics").text, re.M)
        assert evicted is not None and float(evicted.group(1)) == cache["evictions"]
        # The most recent answers are kept, the oldest evicted.
        assert c.post("/v1/completions", json=body("bound: 11")).headers["x-gateway-cache"] == "hit"
        assert c.post("/v1/completions", json=body("bound: 0")).headers["x-gateway-cache"] == "miss"


def test_an_answer_stored_again_under_its_key_is_counted_once(upstream: Upstream, tmp_path: Path) -> None:
    """`no-cache` asks the upstream and stores the fresh answer over the one its key holds: the store's bytes
    count the new entry in place of the old, not both."""
    with serve_config(tmp_path, config(upstream)) as gw, client(gw.url) as c:
        admin = {"authorization": f"Bearer {ADMIN}"}
        assert c.post("/v1/completions", json=body("again: one")).headers["x-gateway-cache"] == "miss"
        first = c.get("/admin/status", headers=admin).json()["cache"]
        for _ in range(3):
            fresh = c.post("/v1/completions", json=body("again: one"), headers={"cache-control": "no-cache"})
            assert fresh.status_code == 200 and fresh.headers["x-gateway-cache"] == "bypass", fresh.text
        cache = c.get("/admin/status", headers=admin).json()["cache"]
        assert (cache["memory_entries"], cache["memory_bytes"]) == (1, first["memory_bytes"]) and first["memory_bytes"]
        assert c.post("/v1/completions", json=body("again: one")).headers["x-gateway-cache"] == "hit"
        assert len(upstream.received) == 4


def test_an_unreadable_max_age_is_a_400(alice: httpx.Client, upstream: Upstream) -> None:
    resp = alice.post("/v1/completions", json=body("cc: bad"), headers={"cache-control": "max-age=soon"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_cache_control"
    assert upstream.received == []


def test_a_config_reload_keeps_the_stored_answers(upstream: Upstream, tmp_path: Path) -> None:
    with serve_config(tmp_path, config(upstream), poll_every=0.1) as gw, client(gw.url) as c:
        assert c.post("/v1/completions", json=body("reload: kept")).headers["x-gateway-cache"] == "miss"
        path = next(tmp_path.glob("gw-*.yaml"))
        before = gw.app.state.reloader.reloads
        rewrite(path, path.read_text() + "\n# edited\n")
        wait_until(lambda: gw.app.state.reloader.reloads > before, timeout=10)
        assert c.post("/v1/completions", json=body("reload: kept")).headers["x-gateway-cache"] == "hit"
    assert len(upstream.received) == 1


def test_an_expired_entry_is_not_served(upstream: Upstream, tmp_path: Path) -> None:
    short = config(upstream).replace("cache: {mode: deterministic}", "cache: {mode: deterministic, ttl_s: 1}")
    with serve_config(tmp_path, short) as gw, client(gw.url) as c:
        assert c.post("/v1/completions", json=body("ttl: gone")).headers["x-gateway-cache"] == "miss"
        assert c.post("/v1/completions", json=body("ttl: gone")).headers["x-gateway-cache"] == "hit"
        time.sleep(1.2)
        # Past its ttl_s the entry is dropped: the rerun asks the upstream again and stores the fresh answer.
        assert c.post("/v1/completions", json=body("ttl: gone")).headers["x-gateway-cache"] == "miss"
        assert c.post("/v1/completions", json=body("ttl: gone")).headers["x-gateway-cache"] == "hit"
    assert len(upstream.received) == 2
