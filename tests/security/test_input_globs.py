"""Issue 11, item 15: a key glob's `*` stops at `/`; `**` crosses it.

The limited key of this suite may call `up/model*`. The declared deployment `up/model/east` has its own
base URL and upstream key: `*` matching `/` let that key reach it.
"""

from __future__ import annotations

import httpx
import pytest

from tests.helpers.errors import ALL_ROUTES
from tests.helpers.upstreams import Recorder

from .conftest import LIMITED_KEY, post


@pytest.mark.parametrize("route", ALL_ROUTES)
@pytest.mark.parametrize("model", ["up/model/east", "up/model-x/east", "up/model/a/b"])
def test_star_does_not_cross_a_slash(client: httpx.Client, up: Recorder, route: str, model: str) -> None:
    resp = post(client, route, {"model": model, "prompt": "hi"}, key=LIMITED_KEY)
    assert resp.status_code == 403, resp.text
    assert up.received == []


def test_star_still_matches_within_a_segment(client: httpx.Client, up: Recorder) -> None:
    resp = post(client, "/v1/completions", {"model": "up/model-x", "prompt": "hi"}, key=LIMITED_KEY)
    assert resp.status_code == 200, resp.text
    got = up.only()
    assert got.path == "/up/v1/completions" and got.headers["authorization"] == "Bearer sk-up-main"


def test_default_patterns_allow_every_model(client: httpx.Client, up: Recorder) -> None:
    resp = post(client, "/v1/completions", {"model": "up/model/east", "prompt": "hi"})
    assert resp.status_code == 200, resp.text
    assert up.only().headers["authorization"] == "Bearer sk-up-east"


def test_models_listing_uses_the_same_globs(client: httpx.Client, up: Recorder) -> None:
    resp = client.get("/v1/models", headers={"authorization": f"Bearer {LIMITED_KEY}"})
    ids = {m["id"] for m in resp.json()["data"]}
    assert all(i.startswith(("up/model", "demo/")) and i.count("/") == 1 for i in ids), ids
