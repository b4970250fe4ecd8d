"""What an operator writes and a client sends that the cache reads: `mode: off` unquoted (YAML's false),
`Cache-Control` sent on several header lines, and the prefix-cache salt inside `inference_extra_params`."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from gateway.config import ConfigError, parse_config
from tests.helpers.errors import SGP_ROUTE
from tests.helpers.upstreams import Upstream

from .conftest import MODEL


def body(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 5, "temperature": 0, **extra}


BASE = """
providers:
  local: {kind: vllm, base_url: "http://127.0.0.1:9/v1"%s}
models:
  - name: alias
    targets: [{model: local/m}]%s
%s
"""


@pytest.mark.parametrize("word", ["off", "Off", "OFF", "no", "false"])
def test_mode_off_unquoted_means_off_in_every_block(word: str) -> None:
    block = f"cache: {{mode: {word}}}"
    loaded = parse_config(BASE % (f", {block}", f"\n    {block}", block))
    assert loaded.config.cache.mode == "off"
    assert loaded.providers["local"].cache is not None and loaded.providers["local"].cache.mode == "off"
    assert loaded.config.models[0].cache is not None and loaded.config.models[0].cache.mode == "off"


@pytest.mark.parametrize(
    ("where", "path"),
    [(("", "", "cache: {mode: on}"), "cache.mode"), (("", "\n    cache: {mode: yes}", ""), "models[0].cache.mode")],
)
def test_mode_on_unquoted_is_refused_naming_the_modes(where: tuple[str, str, str], path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(BASE % where)
    line = str(caught.value)
    assert line.startswith(f"config.yaml: {path}: ") and "deterministic, always or off" in line
    assert "\n" not in line


def test_cache_control_on_several_lines_is_read_whole(alice: httpx.Client, upstream: Upstream) -> None:
    assert alice.post("/v1/completions", json=body("lines: a")).headers["x-gateway-cache"] == "miss"
    # `no-store` on the first line, `max-age` on the second: the first is not lost to the second.
    two = [("cache-control", "no-store"), ("cache-control", "max-age=3600")]
    resp = alice.post("/v1/completions", json=body("lines: a"), headers=two)
    assert resp.status_code == 200 and resp.headers["x-gateway-cache"] == "bypass"
    assert len(upstream.received) == 2
    # `only-if-cached` then `max-age=0`: the stored answer is too old for this request, and no upstream is asked.
    two = [("cache-control", "only-if-cached"), ("cache-control", "max-age=0")]
    resp = alice.post("/v1/completions", json=body("lines: a"), headers=two)
    assert resp.status_code == 504 and resp.json()["error"]["code"] == "cache_miss"
    assert len(upstream.received) == 2
    # One line with both, as before.
    resp = alice.post("/v1/completions", json=body("lines: a"), headers={"cache-control": "only-if-cached, max-age=60"})
    assert resp.headers["x-gateway-cache"] == "hit"


@pytest.mark.parametrize("salt", ["", "a b", "x" * 300, 5, ["tenant"], "new\nline", "tenant\n"])
def test_a_cache_salt_inside_inference_extra_params_is_held_to_the_same_rule(
    alice: httpx.Client, upstream: Upstream, salt: Any
) -> None:
    resp = alice.post("/v1/completions", json=body("salt: bad", inference_extra_params={"cache_salt": salt}))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "inference_extra_params.cache_salt"
    sgp = alice.post(SGP_ROUTE, json=body("salt: bad", inference_extra_params={"cache_salt": salt}))
    assert sgp.status_code == 422 and sgp.json()["detail"][0]["loc"] == ["body", "inference_extra_params", "cache_salt"]
    assert upstream.received == []


def test_a_good_cache_salt_inside_inference_extra_params_reaches_the_engine(
    alice: httpx.Client, upstream: Upstream
) -> None:
    resp = alice.post("/v1/completions", json=body("salt: good", inference_extra_params={"cache_salt": "run/17:x"}))
    assert resp.status_code == 200, resp.text
    # Combined with the key's identity (`prefix_scope: key`, the default; docs/fleets.md): the engine gets a
    # salt of alice's own, made from the one sent, which another client's salt never equals.
    sent = upstream.received[0].json()
    assert re.fullmatch(r"[0-9a-f]{32}", sent["cache_salt"]) and "inference_extra_params" not in sent
    resp = alice.post("/v1/completions", json=body("salt: other", inference_extra_params={"cache_salt": "run/18"}))
    assert resp.status_code == 200 and upstream.received[1].json()["cache_salt"] != sent["cache_salt"]
