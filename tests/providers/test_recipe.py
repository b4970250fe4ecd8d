"""docs/providers.md's recipe for adding a provider, followed as written: its module saved to a temporary
directory, registered through the public registry API, configured, and served through the real app (uvicorn
on a socket) to a loopback upstream. Nothing in gateway/ is edited for the new kind."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.config import ConfigError, parse_config
from providers import REGISTRY, register
from providers.base import Adapter, LocalAdapter
from providers.registry import credential_headers, unregister
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream, reply, reply_sse
from tests.unit.test_import_boundaries import violations

DOC = Path(__file__).resolve().parents[2] / "docs" / "providers.md"
MODULE = "recipe_acme"


def recipe_module() -> str:
    """The recipe's module, as docs/providers.md shows it."""
    text = DOC.read_text(encoding="utf-8")
    found = re.search(r"```python\n(.*?)```", text[text.index("## Adding a provider") :], re.S)
    assert found is not None
    return found.group(1)


@pytest.fixture
def acme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Adapter] | type[LocalAdapter]]:
    (tmp_path / f"{MODULE}.py").write_text(recipe_module(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = register(f"{MODULE}:AcmeAdapter")
    try:
        yield cls
    finally:
        unregister("acme")
        sys.modules.pop(MODULE, None)


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    up.start()
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture
def gateway_url(acme: type[Adapter], upstream: Upstream, tmp_path: Path) -> Iterator[str]:
    config = tmp_path / "gateway.yaml"
    config.write_text(f'providers:\n  mine: {{kind: acme, base_url: "{upstream.url}", api_key: "${{ACME_KEY}}"}}\n')
    with GatewayThread(config, {"ACME_KEY": "acme-secret"}) as gw:
        yield gw.url


def test_the_recipe_module_keeps_the_package_boundaries() -> None:
    assert violations("providers.acme", recipe_module()) == []


def test_the_kind_exists_once_registered_and_its_declarations_reach_the_config(
    acme: type[Adapter] | type[LocalAdapter],
) -> None:
    assert REGISTRY["acme"] is acme
    with pytest.raises(ConfigError) as info:
        parse_config("providers: {mine: {kind: acme}}")
    assert str(info.value) == "config.yaml: providers.mine.base_url: required for kind 'acme'"
    # The same kind registered twice under another class is refused; the same class again is not.
    register(acme)
    with pytest.raises(ValueError, match="already registered"):
        register(type("Other", (acme,), {}))


def test_an_unregistered_kind_fails_the_config_listing_the_registered_ones() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("providers: {mine: {kind: acme, base_url: 'http://h'}}")
    assert str(info.value) == (
        "config.yaml: providers.mine.kind: Invalid enum value 'acme'; valid kinds: " + ", ".join(sorted(REGISTRY))
    )


def test_a_completion_is_served_through_the_new_provider(gateway_url: str, upstream: Upstream) -> None:
    upstream.handler = reply(b'{"output": "Hi there", "done": true, "usage": {"input": 2, "output": 3}}')
    body = {"model": "mine/m1", "prompt": "Say hi", "max_tokens": 5, "stop": ["\n"], "temperature": 0.5}
    answer = httpx.post(f"{gateway_url}/v1/completions", json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert (got["model"], got["choices"][0]["text"], got["choices"][0]["finish_reason"]) == (
        "mine/m1",
        "Hi there",
        "stop",
    )
    assert got["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    sent = upstream.only()
    assert (sent.method, sent.path, sent.headers["x-acme-key"]) == ("POST", "/v1/generate", "acme-secret")
    assert json.loads(sent.body) == {
        "max_output": 5,
        "temperature": 0.5,
        "stop": ["\n"],
        "model": "m1",
        "input": "Say hi",
        "stream": False,
    }


def test_a_stream_is_relayed_event_by_event(gateway_url: str, upstream: Upstream) -> None:
    upstream.handler = reply_sse(
        [b'data: {"output": "Hi", "done": false}', b'data: {"output": " there", "done": true}', b"data: [DONE]"]
    )
    body = {"model": "mine/m1", "prompt": "Say hi", "stream": True}
    with httpx.stream("POST", f"{gateway_url}/v1/completions", json=body, timeout=10) as answer:
        assert answer.status_code == 200
        data = [line[6:] for line in answer.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hi there"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert json.loads(upstream.only().body)["stream"] is True


def test_the_declared_credential_header_is_refused_from_clients(gateway_url: str, upstream: Upstream) -> None:
    body = {"model": "mine/m1", "prompt": "x", "inference_extra_headers": {"X-Acme-Key": "the client's own"}}
    answer = httpx.post(f"{gateway_url}/v1/completions", json=body, timeout=10)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "inference_extra_headers"
    assert upstream.received == []


def test_unregistering_forgets_the_kind_and_its_credential_headers(acme: type[Adapter] | type[LocalAdapter]) -> None:
    assert "x-acme-key" in credential_headers()
    unregister("acme")
    assert "acme" not in REGISTRY and "x-acme-key" not in credential_headers()
