"""The chat route with the same machinery as completions: every dialect's route, routing's fallback,
the response cache and the ledger's row."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from tests.clients.chat.upstreams import MESSAGES, TOOLS
from tests.helpers.sqlite import opened
from tests.helpers.upstreams import Received


def test_every_route(api: httpx.Client, received: list[Received]) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    for path, model in (
        ("/v1/chat/completions", "oa/gpt-3.5-turbo"),
        ("/inference/v1/chat/completions", "oa/gpt-3.5-turbo"),
        ("/v4/beta/chat/completions", "oa/gpt-3.5-turbo"),
        ("/api/v1/compatibility/openai/v1/chat/completions", "oa/gpt-3.5-turbo"),
        ("/m/oa/gpt-3.5-turbo/v1/chat/completions", None),
    ):
        resp = api.post(path, json=body | ({"model": model} if model else {}))
        assert resp.status_code == 200, (path, resp.text)
        assert resp.json()["object"] == "chat.completion"
    assert len(received) == 5 and {r.json()["model"] for r in received} == {"gpt-3.5-turbo"}


def test_cache_hit_on_identical_chat(api: httpx.Client, received: list[Received]) -> None:
    body = {"model": "cached", "messages": [{"role": "user", "content": "cache me"}], "tools": TOOLS}
    first = api.post("/v1/chat/completions", json=body)
    second = api.post("/v1/chat/completions", json=body)
    assert first.headers["x-gateway-cache"] == "miss" and second.headers["x-gateway-cache"] == "hit"
    one, two = first.json(), second.json()
    assert two["object"] == "chat.completion" and two["id"] != one["id"]
    assert two["choices"] == one["choices"] and two["usage"] == one["usage"]
    # The key holds the messages, the tools and the response format: any change is another entry.
    for changed in (
        body | {"messages": [{"role": "user", "content": "cache me too"}]},
        {k: v for k, v in body.items() if k != "tools"},
        body | {"response_format": {"type": "json_object"}},
    ):
        assert api.post("/v1/chat/completions", json=changed).headers["x-gateway-cache"] == "miss"
    assert len(received) == 4


def test_fallback_serves_chat(api: httpx.Client, received: list[Received]) -> None:
    """The same failover loop: the alias's target refuses the connection, its fallback answers."""
    resp = api.post("/v1/chat/completions", json={"model": "resilient", "messages": MESSAGES})
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-gateway-provider"] == "oa" and resp.headers["x-gateway-attempts"] == "2"
    assert resp.json()["choices"][0]["message"]["content"]
    assert len(received) == 1


def test_ledger_row_records_the_endpoint(api: httpx.Client, db: Path) -> None:
    rid = f"chat-ledger-{time.monotonic_ns()}"
    body = {"model": "demo/echo", "messages": [{"role": "user", "content": "book me"}]}
    assert api.post("/v1/chat/completions", json=body, headers={"x-request-id": rid}).status_code == 200
    deadline = time.monotonic() + 10
    rows: list[tuple[Any, ...]] = []
    while not rows and time.monotonic() < deadline:
        with opened(db, timeout=10) as conn:
            rows = conn.execute(
                "SELECT endpoint, dialect, model, status, completion_tokens FROM requests WHERE request_id = ?", (rid,)
            ).fetchall()
        time.sleep(0.05)
    assert rows and rows[0][:4] == ("chat", "openai", "demo/echo", 200) and rows[0][4] > 0
