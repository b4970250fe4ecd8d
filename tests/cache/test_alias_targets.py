"""Stored answers after a config reload: kept while a model asked for routes to the same targets on the same
servers, not served once it names others or its provider points at another server (the answers were another
model's, or another server's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from msgspec.structs import replace

from gateway.cache.key import backend_of
from gateway.config import LimitsConfig, ProviderConfig
from tests.clients.conftest import VLLMLike
from tests.helpers.servers import GatewayThread, rewrite, serve_config
from tests.helpers.upstreams import Upstream
from tests.helpers.waiting import wait_until

from .conftest import MODEL, client, config

OTHER = "local/facebook/opt-350m"


def _reload(gw: GatewayThread, path: Path, text: str) -> None:
    before = gw.app.state.reloader.reloads
    rewrite(path, text)
    wait_until(lambda: gw.app.state.reloader.reloads > before, timeout=10)


def test_an_alias_repointed_by_a_reload_does_not_serve_its_former_targets_answers(
    upstream: Upstream, tmp_path: Path
) -> None:
    payload = {"model": "everyone", "prompt": "alias: repointed", "max_tokens": 5, "temperature": 0}
    with serve_config(tmp_path, config(upstream), poll_every=0.1) as gw, client(gw.url) as c:
        assert c.post("/v1/completions", json=payload).headers["x-gateway-cache"] == "miss"
        path = next(tmp_path.glob("gw-*.yaml"))
        text = path.read_text()
        _reload(gw, path, text + "\n# an edit that leaves the alias as it was\n")
        assert c.post("/v1/completions", json=payload).headers["x-gateway-cache"] == "hit"
        first = f"targets: [{{model: {MODEL}}}]\n    cache: {{mode: always, scope: shared}}"
        assert first in text
        _reload(gw, path, text.replace(first, first.replace(MODEL, OTHER)))
        again = c.post("/v1/completions", json=payload)
        assert again.status_code == 200, again.text
        assert again.headers["x-gateway-cache"] == "miss"
        assert again.headers["x-gateway-model"] == OTHER
        assert c.post("/v1/completions", json=payload).headers["x-gateway-cache"] == "hit"
    assert [r.json()["model"] for r in upstream.received] == [MODEL.partition("/")[2], OTHER.partition("/")[2]]


@pytest.mark.parametrize("model", [MODEL, "everyone"], ids=["provider-model", "alias"])
def test_a_provider_pointed_at_another_server_by_a_reload_does_not_serve_the_former_servers_answers(
    upstream: Upstream, tmp_path: Path, model: str
) -> None:
    payload = {"model": model, "prompt": f"backend: moved {model}", "max_tokens": 5, "temperature": 0}
    with Upstream() as moved, serve_config(tmp_path, config(upstream), poll_every=0.1) as gw, client(gw.url) as c:
        moved.handler = VLLMLike().handler
        assert c.post("/v1/completions", json=payload).headers["x-gateway-cache"] == "miss"
        path = next(tmp_path.glob("gw-*.yaml"))
        text = path.read_text()
        # What does not change the server keeps the answers: the provider's own quota, another provider.
        provider = f"local: {{kind: vllm, base_url: {upstream.url}/v1}}"
        assert provider in text
        kept = text.replace(
            provider, provider[:-1] + ', limits: {rpm: 1000}}\n  spare: {kind: vllm, base_url: "http://127.0.0.1:9/v1"}'
        )
        _reload(gw, path, kept)
        assert c.post("/v1/completions", json=payload).headers["x-gateway-cache"] == "hit"
        _reload(gw, path, kept.replace(upstream.url, moved.url))
        again = c.post("/v1/completions", json=payload)
        assert again.status_code == 200, again.text
        assert again.headers["x-gateway-cache"] == "miss"
        assert c.post("/v1/completions", json=payload).headers["x-gateway-cache"] == "hit"
        # Pointed back, the first server's answers (not yet expired) serve again: the key names the server.
        _reload(gw, path, kept)
        assert c.post("/v1/completions", json=payload).headers["x-gateway-cache"] == "hit"
    assert len(upstream.received) == 1 and len(moved.received) == 1


def test_a_providers_server_identity_holds_no_secret_and_leaves_out_its_key() -> None:
    base = ProviderConfig(kind="vllm", base_url="https://user:s3cret-pass@vllm.internal/v1", api_key="sk-one-7f3a")
    identity = backend_of(base)
    assert "s3cret" not in identity and "sk-one" not in identity and "vllm.internal" not in identity
    assert backend_of(replace(base, api_key="sk-two-91c2", limits=LimitsConfig(rpm=5))) == identity
    assert backend_of(replace(base, base_url="https://user:s3cret-pass@vllm-2.internal/v1")) != identity
    assert backend_of(replace(base, kind="sglang")) != identity
    # A fleet's replicas are copies of one engine: scaling it keeps its answers.
    assert backend_of(replace(base, replicas=["http://a:8000/v1"])) == identity
