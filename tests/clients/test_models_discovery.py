"""Issue 12, item 7: GET /v1/models lists what can really be called, over real sockets.

The gateway (uvicorn in a thread) asks loopback upstreams for their models in the background: a
vLLM-like server answering `GET /v1/models` and an Ollama-like one answering `GET /api/tags` (bodies
from tests/fixtures, see SOURCES.md). Tests poll the gateway's own `/v1/models` with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from tests.helpers.clients import openai_client
from tests.helpers.recordings import fixture_bytes
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Handler, Received, Upstream, hang, reply

FULL_KEY = "gk-models-full-51c0e2"
LIMITED_KEY = "gk-models-vl-7a0b93"
VL_UPSTREAM_KEY = "sk-vl-models-e2e-0f3c9d2a"
ENV = {"MODELS_FULL_KEY": FULL_KEY, "MODELS_LIMITED_KEY": LIMITED_KEY, "MODELS_VL_KEY": VL_UPSTREAM_KEY}

CONFIG = """
discovery: {{ttl_ms: {ttl_ms}, timeout_ms: {timeout_ms}}}
retries: {{attempts: 1}}
keys:
  - {{name: full, key: "${{MODELS_FULL_KEY}}"}}
  - {{name: vl-only, key: "${{MODELS_LIMITED_KEY}}", models: ["vl/**", "both"]}}
providers:
  demo: {{kind: fake, models: [echo]}}
  vl:
    kind: vllm
    base_url: {u}/vl/v1
    api_key: "${{MODELS_VL_KEY}}"
    headers: {{x-team: evals}}
    deployments: {{east: {{base_url: {u}/vl-east/v1}}}}
  ol: {{kind: ollama, base_url: {u}/ol}}
  # Its key variable is unset: it cannot be called, so nothing of it is listed and it is never asked.
  gone:
    kind: vllm
    base_url: {u}/gone/v1
    api_key: "${{MODELS_UNSET_KEY}}"
    models: [declared-but-gone]
  # A hosted catalog is asked only with `discover: true`.
  hosted: {{kind: openai, api_key: sk-hosted-e2e, base_url: {u}/hosted/v1}}
models:
  - {{name: both, targets: [{{model: gone/x}}, {{model: demo/echo}}]}}
  - {{name: dead, targets: [{{model: gone/x}}]}}
"""

VL_IDS = ["vl/meta-llama/Llama-3.1-8B", "vl/sql-lora"]
OL_IDS = ["ol/codellama:13b", "ol/llama3:latest"]
LISTED = [
    ("both", "gateway"),
    ("demo/echo", "demo"),
    *[(i, "vl") for i in VL_IDS],
    *[(i, "ol") for i in OL_IDS],
]


class Listings:
    """What the loopback upstream answers to each listing path; tests swap answers while it runs."""

    def __init__(self, **answers: Handler) -> None:
        self.answers: dict[str, Handler] = {
            "/vl/v1/models": reply(fixture_bytes("vllm/models_list.json")),
            "/ol/api/tags": reply(fixture_bytes("ollama/api_tags.json")),
        }
        self.answers.update({k.replace("_", "/"): v for k, v in answers.items()})

    async def __call__(self, request: web.Request, received: Received) -> web.StreamResponse:
        answer = self.answers.get(received.path)
        if answer is None:
            return web.Response(status=404)
        return await answer(request, received)


def write_config(tmp_path: Path, upstream: Upstream, *, ttl_ms: int = 60_000, timeout_ms: int = 5_000) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG.format(u=upstream.url, ttl_ms=ttl_ms, timeout_ms=timeout_ms))
    return path


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture
def start(upstream: Upstream, tmp_path: Path) -> Iterator[Callable[..., GatewayThread]]:
    """Start the gateway on CONFIG once the test has set the upstream's listings."""
    started: list[GatewayThread] = []

    def run(listings: Listings | None = None, **config: int) -> GatewayThread:
        upstream.listings = listings or Listings()
        gw = GatewayThread(write_config(tmp_path, upstream, **config), ENV)
        gw.start()
        started.append(gw)
        return gw

    try:
        yield run
    finally:
        for gw in started:
            gw.stop()


def listed(gw: GatewayThread, key: str = FULL_KEY) -> list[tuple[str, str]]:
    resp = httpx.get(gw.url + "/v1/models", headers={"authorization": f"Bearer {key}"}, trust_env=False, timeout=5)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "list"
    return [(m["id"], m["owned_by"]) for m in body["data"]]


def poll(
    gw: GatewayThread, until: Callable[[list[tuple[str, str]]], bool], timeout: float = 10, key: str = FULL_KEY
) -> list[tuple[str, str]]:
    deadline = time.monotonic() + timeout
    while True:
        models = listed(gw, key)
        if until(models):
            return models
        assert time.monotonic() < deadline, f"timed out; GET /v1/models still answers {models[:20]}"
        time.sleep(0.02)


def has(*ids: str) -> Callable[[list[tuple[str, str]]], bool]:
    return lambda models: set(ids) <= {m for m, _ in models}


def wait_for_calls(upstream: Upstream, path: str, count: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while sum(r.path == path for r in upstream.listed) < count:
        assert time.monotonic() < deadline, f"{path} was asked {[r.path for r in upstream.listed]}"
        time.sleep(0.01)


def test_served_models_are_listed_with_the_vendor_prefix(
    start: Callable[..., GatewayThread], upstream: Upstream
) -> None:
    gw = start()
    assert poll(gw, has(*VL_IDS, *OL_IDS)) == LISTED

    # Each listing call carries the provider's credential and the operator's headers, as completions do.
    vl = next(r for r in upstream.listed if r.path == "/vl/v1/models")
    assert (vl.method, vl.headers["authorization"], vl.headers["x-team"]) == (
        "GET",
        f"Bearer {VL_UPSTREAM_KEY}",
        "evals",
    )
    ol = next(r for r in upstream.listed if r.path == "/ol/api/tags")
    assert "authorization" not in ol.headers
    assert upstream.received == []  # nothing but listings went out

    # A listed id is a model the client can call: it reaches the upstream under the upstream's own name.
    upstream.handler = reply(fixture_bytes("vllm/completion_opt125m.json"))
    resp = httpx.post(
        gw.url + "/v1/completions",
        json={"model": "vl/sql-lora", "prompt": "SELECT", "max_tokens": 5},
        headers={"authorization": f"Bearer {FULL_KEY}"},
        trust_env=False,
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    assert (upstream.only().path, upstream.only().json()["model"]) == ("/vl/v1/completions", "sql-lora")


def test_a_provider_that_cannot_be_called_is_left_out(start: Callable[..., GatewayThread], upstream: Upstream) -> None:
    gw = start(Listings(**{"/gone/v1/models": reply(fixture_bytes("vllm/models_list.json"))}))
    models = poll(gw, has(*VL_IDS, *OL_IDS))
    ids = {m for m, _ in models}
    # Neither its declared model, nor an alias whose only target it is, nor the alias target itself.
    assert not {"gone/declared-but-gone", "gone/x", "dead"} & ids
    assert not any(m.startswith("gone/") for m in ids)
    assert "both" in ids  # still callable through demo/echo
    # It was never asked, nor the hosted catalog that did not opt in.
    assert {r.path for r in upstream.listed} == {"/vl/v1/models", "/ol/api/tags"}


def test_the_key_globs_filter_the_listing(start: Callable[..., GatewayThread]) -> None:
    gw = start()
    poll(gw, has(*VL_IDS, *OL_IDS))
    assert listed(gw, LIMITED_KEY) == [("both", "gateway"), *[(i, "vl") for i in VL_IDS]]


def test_an_upstream_that_fails_keeps_its_last_good_list(
    start: Callable[..., GatewayThread], upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    listings = Listings()
    gw = start(listings, ttl_ms=150)
    poll(gw, has(*VL_IDS, *OL_IDS))

    calls = sum(r.path == "/vl/v1/models" for r in upstream.listed)
    listings.answers["/vl/v1/models"] = reply(
        b'{"error": {"message": "Bearer ' + VL_UPSTREAM_KEY.encode() + b'"}}', 500
    )
    listings.answers["/ol/api/tags"] = reply(b"<html>proxy error</html>", 200)
    wait_for_calls(upstream, "/vl/v1/models", calls + 3)
    wait_for_calls(upstream, "/ol/api/tags", calls + 3)
    assert listed(gw) == LISTED

    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len([m for m in failures if "'vl'" in m]) == 1, failures  # once, not once per refresh
    assert len([m for m in failures if "'ol'" in m]) == 1, failures
    assert "HTTP 500" in failures[0] or "HTTP 500" in failures[1]
    assert not any(VL_UPSTREAM_KEY in r.getMessage() or upstream.url in r.getMessage() for r in caplog.records)

    # It answers again with another list: that one replaces the last good one.
    listings.answers["/vl/v1/models"] = reply(
        b'{"object": "list", "data": [{"id": "Qwen/Qwen2.5-7B", "object": "model"}]}'
    )
    models = poll(gw, has("vl/Qwen/Qwen2.5-7B"))
    assert not set(VL_IDS) & {m for m, _ in models}
    assert any("'vl' answers again" in r.getMessage() for r in caplog.records)


def _huge_listing() -> bytes:
    hostile = [
        "../../etc/passwd",
        "a/./b",
        "x?admin=1",
        "x#frag",
        "back\\slash",
        "bell\x07",
        "zero\u200bwidth",
        "line\nbreak",
        "x" * 300,
        "",
        "m/east",  # would route to the provider's deployment `east`
    ]
    cards = [{"id": h, "object": "model"} for h in hostile]
    cards += [{"id": f"m-{i:06d}", "object": "model", "owned_by": "vllm"} for i in range(100_000)]
    return json.dumps({"object": "list", "data": cards}).encode()


def test_a_huge_or_hostile_listing_is_bounded_and_filtered(start: Callable[..., GatewayThread]) -> None:
    gw = start(Listings(**{"/vl/v1/models": reply(_huge_listing())}))
    models = poll(gw, lambda ms: any(m.startswith("vl/") for m, _ in ms), timeout=20)
    vl = [m for m, owner in models if owner == "vl"]
    assert vl == [f"vl/m-{i:06d}" for i in range(10_000)]  # discovery.max_models, in the upstream's order
    assert all(m.isprintable() and "?" not in m and "#" not in m and ".." not in m for m, _ in models)


def test_a_slow_listing_never_slows_the_gateways_own_listing(
    start: Callable[..., GatewayThread], upstream: Upstream
) -> None:
    answered = False

    async def slow(request: web.Request, received: Received) -> web.StreamResponse:
        nonlocal answered
        await asyncio.sleep(2.0)
        answered = True
        return web.Response(body=fixture_bytes("vllm/models_list.json"), content_type="application/json")

    gw = start(Listings(**{"/vl/v1/models": slow}))
    wait_for_calls(upstream, "/vl/v1/models", 1)
    # The refresh is in flight: the listing answers at once with what is known so far.
    for _ in range(5):
        began = time.monotonic()
        models = listed(gw)
        assert time.monotonic() - began < 0.5
        assert ("demo/echo", "demo") in models
    assert not answered
    assert not any(m.startswith("vl/") for m, _ in models)
    poll(gw, has(*VL_IDS))


def test_a_hanging_listing_does_not_delay_shutdown(upstream: Upstream, tmp_path: Path) -> None:
    cancelled = threading.Event()
    upstream.listings = Listings(**{"/vl/v1/models": hang(cancelled)})
    gw = GatewayThread(write_config(tmp_path, upstream, timeout_ms=30_000), ENV)
    gw.start()
    try:
        wait_for_calls(upstream, "/vl/v1/models", 1)
    finally:
        began = time.monotonic()
        gw.stop()
    assert time.monotonic() - began < 2
    assert cancelled.wait(5), "the gateway kept the listing call open after it stopped"


def test_the_openai_client_lists_the_discovered_models(start: Callable[..., GatewayThread]) -> None:
    gw = start()
    poll(gw, has(*VL_IDS, *OL_IDS))
    with openai_client(gw.url + "/v1", FULL_KEY) as client:
        page = client.models.list()
    assert [(m.id, m.owned_by) for m in page] == LISTED
    assert all(m.object == "model" for m in page)


def test_a_reloaded_config_is_followed(
    start: Callable[..., GatewayThread], upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENV.items():  # a reload reads the process environment
        monkeypatch.setenv(name, value)
    gw = start()
    poll(gw, has(*VL_IDS, *OL_IDS))
    path = tmp_path / "config.yaml"
    text = path.read_text().replace("  ol: {kind: ollama", "  ol2: {kind: ollama")
    path.write_text(text)
    models = poll(gw, has("ol2/codellama:13b"), timeout=15)
    assert not any(m.startswith("ol/") for m, _ in models)


def test_a_provider_nobody_answers_for_is_left_out_until_it_answers(tmp_path: Path) -> None:
    """A vLLM that is not up (the connection is refused) cannot serve its declared models or its alias:
    they are not listed and the status page says why; once it listens, they are back with what it serves."""
    late = Upstream()  # bound but not listening yet: connecting is refused
    late.listings = Listings()
    admin = "adm-models-late-3e1f"
    path = tmp_path / "config.yaml"
    path.write_text(
        f"""
discovery: {{ttl_ms: 150}}
admin: {{key: {admin}}}
providers:
  demo: {{kind: fake, models: [echo]}}
  vl: {{kind: vllm, base_url: "{late.url}/vl/v1", models: [declared]}}
models:
  - {{name: vl-only, targets: [{{model: vl/declared}}]}}
  - {{name: mixed, targets: [{{model: vl/declared}}, {{model: demo/echo}}]}}
"""
    )

    def vl_status(gw: GatewayThread) -> dict[str, object]:
        resp = httpx.get(gw.url + "/admin/status", headers={"authorization": f"Bearer {admin}"}, trust_env=False)
        assert resp.status_code == 200, resp.text
        return next(p for p in resp.json()["providers"] if p["name"] == "vl")

    started = False
    try:
        with GatewayThread(path, {}) as gw:
            deadline = time.monotonic() + 10
            while vl_status(gw)["available"]:
                assert time.monotonic() < deadline, "the refused listing never marked 'vl' unreachable"
                time.sleep(0.02)
            assert vl_status(gw)["reason"] == "Provider 'vl' is unreachable: the connection was refused"
            assert listed(gw) == [("mixed", "gateway"), ("demo/echo", "demo")]

            late.start()
            started = True
            models = poll(gw, has("vl-only", "vl/declared", *VL_IDS))
            assert [m for m, _ in models][:2] == ["vl-only", "mixed"]
            assert vl_status(gw) == {**vl_status(gw), "available": True, "reason": None}
    finally:
        if not started:
            late.start()  # stop() needs the loop running
        late.stop()
