"""The model-scoped completion route, with the official SDK."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.clients.tokenizer.upstreams import BASE, FULL_KEY, MODEL, SERVED
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
