"""The model-scoped completion route, with the official SDK."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.clients.tokenizer.upstreams import AUTH, BASE, FULL_KEY, MODEL, NARROW_KEY, SERVED, error_envelope
from tests.helpers.clients import openai_client
from tests.helpers.servers import GatewayThread
from tests.helpers.upstreams import Upstream

# -- the model-scoped completion route, with the official SDK ---------------------------------------------------


def test_openai_client_completes_under_the_model_path(gateway: GatewayThread, upstream: Upstream) -> None:
    with openai_client(f"{gateway.url}{BASE}/v1", FULL_KEY) as client:
        done = client.completions.create(model=MODEL, prompt="San Francisco is a", max_tokens=5)
        assert done.choices[0].text
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model="vl/someone-else", prompt="x", max_tokens=5)
        assert caught.value.body["param"] == "model"  # type: ignore[index]
    sent = upstream.only()
    assert sent.path == "/vl/v1/completions"
    assert sent.json()["model"] == SERVED


@pytest.mark.parametrize("body", [{"prompt": "x"}, {"prompt": "x", "model": None}], ids=["absent", "null"])
def test_a_completion_without_a_model_takes_the_one_in_the_path(
    api: httpx.Client, upstream: Upstream, body: dict[str, Any]
) -> None:
    resp = api.post(f"{BASE}/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == MODEL
    assert upstream.only().json()["model"] == SERVED


# -- the model-scoped model list -----------------------------------------------------------------------------------


def test_the_model_path_lists_its_one_model(gateway: GatewayThread, upstream: Upstream) -> None:
    # A client given `.../m/<model>/v1` as its base URL asks there what it may send (the SDK's models.list(),
    # `vllm bench serve` without --model, a readiness probe): the model of the path, nothing else.
    with openai_client(f"{gateway.url}{BASE}/v1", FULL_KEY) as client:
        listed = client.models.list().data
        assert [(m.id, m.owned_by) for m in listed] == [(MODEL, "vl")]
        done = client.completions.create(model=listed[0].id, prompt="San Francisco is a", max_tokens=5)
        assert done.model == MODEL
    with openai_client(f"{gateway.url}/m/evalmodel/v1", FULL_KEY) as client:
        assert [(m.id, m.owned_by) for m in client.models.list().data] == [("evalmodel", "gateway")]
    assert [r.path for r in upstream.received] == ["/vl/v1/completions"]  # the list asks no upstream


def test_the_model_paths_list_follows_the_key_and_the_router(gateway: GatewayThread, upstream: Upstream) -> None:
    with httpx.Client(base_url=gateway.url, trust_env=False, timeout=15) as c:
        error_envelope(c.get(f"{BASE}/v1/models"), 401, "missing_api_key", param=None)
        narrow = {"authorization": f"Bearer {NARROW_KEY}"}
        error_envelope(c.get(f"{BASE}/v1/models", headers=narrow), 403, "model_not_allowed")
        assert c.get("/m/ll/tiny/v1/models", headers=narrow).json()["data"][0]["id"] == "ll/tiny"
        error_envelope(c.get("/m/nope/x/v1/models", headers=AUTH), 404, "model_not_found")
        error_envelope(c.get("/m/vl/a%3Fb/v1/models", headers=AUTH), 400, "invalid_value")
        # As GET /v1/models lists only what can be called: a provider whose key variable is unset, nothing.
        assert c.get(f"/m/vlgone/{SERVED}/v1/models", headers=AUTH).json() == {"object": "list", "data": []}
        assert c.post(f"{BASE}/v1/models", headers=AUTH).status_code == 405
    assert upstream.received == []
