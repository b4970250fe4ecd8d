"""An alias's stored answers after a config reload: kept while the alias names the same targets, not served
once it names others (the answers were another model's)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream
from tests.helpers.waiting import wait_until

from .conftest import MODEL, client, config

OTHER = "local/facebook/opt-350m"


def _reload(gw: GatewayThread, path: Path, text: str) -> None:
    before = gw.app.state.reloader.reloads
    path.write_text(text)
    wait_until(lambda: gw.app.state.reloader.reloads > before, timeout=10)


def test_an_alias_repointed_by_a_reload_does_not_serve_its_former_targets_answers(
    upstream: Upstream, tmp_path: Path
) -> None:
    payload = {"model": "everyone", "prompt": "alias: repointed", "max_tokens": 5, "temperature": 0}
    with serve_config(tmp_path, config(upstream)) as gw, client(gw.url) as c:
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
