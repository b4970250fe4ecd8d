"""Issue 12, item 7, the pure parts: reading a model listing, the listing request, the config, and what
the router lists (gateway/edge/discovery.py, gateway/path/routing.py)."""

from __future__ import annotations

import json

import pytest

from gateway.config import ConfigError, parse_config
from gateway.edge.discovery import NotAListing, listed_ids, listing_request, wanted
from gateway.path.routing import Router
from tests.helpers.recordings import fixture_bytes


def test_vllm_listing_ids_keep_the_upstreams_order() -> None:
    ids, refused = listed_ids(fixture_bytes("vllm/models_list.json"), "vl", (), 10)
    assert (ids, refused) == (["vl/meta-llama/Llama-3.1-8B", "vl/sql-lora"], 0)


def test_ollama_tags_are_read_by_name() -> None:
    ids, _ = listed_ids(fixture_bytes("ollama/api_tags.json"), "ol", (), 10)
    assert ids == ["ol/codellama:13b", "ol/llama3:latest"]


def test_newer_ollama_and_llamacpp_shapes() -> None:
    # A bare array of cards (Together's documented answer), and `models` entries carrying only `model`.
    assert listed_ids(b'[{"id": "a", "object": "model", "type": "language"}]', "t", (), 10)[0] == ["t/a"]
    assert listed_ids(b'{"models": [{"model": "b.gguf"}]}', "l", (), 10)[0] == ["l/b.gguf"]
    # llama.cpp answers both lists; `data` is the OpenAI one.
    assert listed_ids(b'{"models": [{"name": "x"}], "data": [{"id": "y"}]}', "l", (), 10)[0] == ["l/y"]


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"{}",
        b'{"object": "list"}',
        b'{"data": [{"id": 5}]}',
        b'{"data": "x"}',
        b"null",
        b'"a"',
        b'{"data": [{"id": "\xff"}]}',
    ],
)
def test_an_answer_that_is_not_a_listing_is_refused(body: bytes) -> None:
    with pytest.raises(NotAListing) as info:
        listed_ids(body, "vl", (), 10)
    assert "not a model list" in str(info.value)


def test_ids_a_client_could_not_send_back_are_left_out() -> None:
    hostile = ["..", "a/../b", "a?b", "a#b", "a\\b", "a\x00b", "tab\tx", "\u202eevil", "x" * 254, "", "m/east"]
    body = json.dumps({"data": [{"id": h} for h in hostile] + [{"id": "ok"}, {"id": "ok"}, {"id": "x" * 253}]})
    ids, refused = listed_ids(body.encode(), "vl", {"east"}, 10)
    # `vl/` + 253 characters is 256, the longest model string a client may send.
    assert ids == ["vl/ok", "vl/" + "x" * 253]
    assert refused == len(hostile)


def test_at_most_the_limit_is_kept() -> None:
    body = json.dumps({"data": [{"id": f"m{i}"} for i in range(100_000)]}).encode()
    ids, left_out = listed_ids(body, "vl", (), 10_000)
    # A long listing is read only as far as it must be: what was read past the limit is counted.
    assert ids == [f"vl/m{i}" for i in range(10_000)] and 0 < left_out <= 90_000
    exactly = json.dumps({"data": [{"id": f"m{i}"} for i in range(3)]}).encode()
    assert listed_ids(exactly, "vl", (), 3) == (["vl/m0", "vl/m1", "vl/m2"], 0)


CONFIG = """
providers:
  vl: {kind: vllm, base_url: "http://gpu:8000/v1/", api_key: sk-vl, headers: {Authorization: operator, X-Team: a}}
  ol: {kind: ollama}
  tg: {kind: together, api_key: tg-key}
  tg-on: {kind: together, api_key: tg-key, discover: true}
  vl-off: {kind: vllm, base_url: "http://gpu:8000/v1", discover: false}
  lc: {kind: llamacpp, base_url: "http://cpu:8080"}
  tgi: {kind: tgi, base_url: "http://tgi:80"}
  az: {kind: azure, api_key: k, base_url: "https://x.openai.azure.com"}
  only-deployments:
    kind: vllm
    deployments: {a: {base_url: "http://a:8000/v1"}}
"""


def test_the_listing_request_per_kind() -> None:
    providers = parse_config(CONFIG, env={}).providers
    vl = listing_request("vl", providers["vl"])
    assert vl is not None
    # The credential wins over an operator header of the same name, as on completions.
    assert (vl.method, vl.url, vl.body) == ("GET", "http://gpu:8000/v1/models", b"")
    assert vl.headers == {"accept": "application/json", "authorization": "Bearer sk-vl", "x-team": "a"}
    ol = listing_request("ol", providers["ol"])
    assert ol is not None and (ol.url, "authorization" in ol.headers) == ("http://127.0.0.1:11434/api/tags", False)
    tg = listing_request("tg", providers["tg"])
    assert tg is not None and tg.url == "https://api.together.xyz/v1/models"
    lc, tgi = listing_request("lc", providers["lc"]), listing_request("tgi", providers["tgi"])
    assert lc is not None and lc.url == "http://cpu:8080/v1/models"
    assert tgi is not None and tgi.url == "http://tgi:80/v1/models"
    assert listing_request("az", providers["az"]) is None
    assert listing_request("only-deployments", providers["only-deployments"]) is None

    on = {name for name, p in providers.items() if wanted(p)}
    assert on == {"vl", "ol", "tg-on", "lc", "tgi", "only-deployments"}


def test_discover_on_a_kind_without_a_listing_fails_the_load() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("providers:\n  a: {kind: anthropic, api_key: k, discover: true}\n", "c.yaml", env={})
    assert str(info.value) == "c.yaml: providers.a.discover: kind 'anthropic' has no model listing the gateway can read"
    with pytest.raises(ConfigError) as info:
        parse_config("discovery: {ttl_ms: 10}\n", "c.yaml", env={})
    assert str(info.value).startswith("c.yaml: discovery.ttl_ms: ")


ROUTED = """
providers:
  demo: {kind: fake, models: [echo]}
  vl: {kind: vllm, base_url: "http://gpu:8000/v1"}
  fw: {kind: fireworks, api_key: "${FW_KEY}", models: [declared]}
models:
  - {name: mixed, targets: [{model: fw/a}, {model: demo/echo}]}
  - {name: dead, targets: [{model: fw/a}]}
  - {name: saved, targets: [{model: fw/a}], fallbacks: [demo/echo]}
"""


def test_the_router_lists_what_can_be_called() -> None:
    router = Router(parse_config(ROUTED, env={}))
    discovered = {"vl": ("vl/m1", "vl/m2"), "fw": ("fw/listed",), "nope": ("nope/x",)}
    assert router.model_ids(discovered) == [
        ("mixed", "gateway"),
        ("saved", "gateway"),  # its fallback can serve it
        ("demo/echo", "demo"),
        ("vl/m1", "vl"),
        ("vl/m2", "vl"),
    ]
    # With the key variable set, everything of fw is listed.
    router = Router(parse_config(ROUTED, env={"FW_KEY": "k"}))
    ids = [m for m, _ in router.model_ids(discovered)]
    assert ids == ["mixed", "dead", "saved", "fw/a", "demo/echo", "fw/declared", "vl/m1", "vl/m2", "fw/listed"]


def test_the_router_memoizes_the_listing_per_published_value() -> None:
    router = Router(parse_config(ROUTED, env={}))
    first = {"vl": ("vl/m1",)}
    assert router.model_ids(first) is router.model_ids(first)
    assert [m for m, _ in router.model_ids({"vl": ("vl/m2",)})][-1] == "vl/m2"


def whole(cards: list[dict[str, object]], limit: int) -> list[str]:
    return [f"vl/{c['id']}" for c in cards if isinstance(c.get("id"), str)][:limit]


@pytest.mark.parametrize("indent", [None, 2])
def test_a_long_listing_read_by_prefixes_says_what_the_whole_says(indent: int | None) -> None:
    # Cuts land inside ids holding the separator, inside each card's own list of objects, and inside
    # another key's list before `data`: none may change which ids are kept or their order.
    cards: list[dict[str, object]] = [
        {"id": f"m{i}" + ("},{x" if i % 3 == 0 else ""), "permission": [{"a": 1}, {"b": "}, {"}]} for i in range(30_000)
    ]
    junk: list[dict[str, object]] = [{} for _ in range(50_000)]
    for envelope in ({"junk": junk, "object": "list", "data": cards}, {"models": cards}, cards):
        body = json.dumps(envelope, indent=indent).encode()
        assert len(body) > 1_000_000
        for limit in (5, 10_000, 29_999, 30_000, 40_000):
            ids, _ = listed_ids(body, "vl", (), limit)
            assert ids == whole(cards, limit), (limit, type(envelope))


def test_a_listing_of_millions_of_entries_without_ids_is_given_up_early() -> None:
    body = b'{"data": [' + b",".join([b"{}"] * 3_000_000) + b"]}"
    ids, left_out = listed_ids(body, "vl", (), 10_000)
    assert ids == [] and 40_000 <= left_out < 200_000  # SCAN_FACTOR x the limit, not three million
