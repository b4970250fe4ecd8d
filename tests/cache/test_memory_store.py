"""The memory store holds buffered answers as they were sent and shared, and entries of events encoded:
what it counts against `max_bytes`, that no request changes an entry it was answered with, and that an entry
serves no longer than the `ttl_s` in force when it is read."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gateway.cache.entry import OVERHEAD, VERSION, Entry, dump, events_of, size
from gateway.cache.store import SLOT, MemoryStore
from tests.helpers.servers import serve_config
from tests.helpers.upstreams import Upstream
from wire.schema import Choice, Usage

from .conftest import ADMIN, client, config
from .test_alias_targets import _reload
from .test_buffered import body
from .test_streams import choices_of, streamed


def entry(sent: bytes | None = None, text: str = "hi") -> Entry:
    events = [] if sent is not None else [[Choice(text=text, index=0, logprobs=None, finish_reason="stop")]]
    usage = Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
    return Entry(VERSION, 0.0, "m", "p", "p/m", usage, events, None, sent)


ANSWER = (
    b'{"object":"text_completion","id":"cmpl-1","created":1,"model":"m",'
    b'"choices":[{"text":"hi","index":0,"logprobs":null,"finish_reason":"stop"}]}'
)


def test_an_entry_counts_its_client_bytes_plus_the_overhead_or_its_encoding() -> None:
    assert size(entry(ANSWER)) == len(ANSWER) + OVERHEAD
    of_events = entry(text="x" * 1000)
    assert size(of_events) == len(dump(of_events)) > 1000


def test_the_bound_counts_each_entry_and_its_key_and_evicts_the_least_recent() -> None:
    now = [0.0]
    evicted: list[int] = []
    one = 300 + OVERHEAD + 5 + SLOT  # an entry's client bytes, its overhead, its key and the store's slot
    store = MemoryStore(2 * one + 100, clock=lambda: now[0], on_evict=evicted.append)
    a, b, c = entry(b"a" * 300), entry(b"b" * 300), entry(b"c" * 300)
    store.keep(b"key-a", "t", a, size(a))
    store.keep(b"key-b", "t", b, size(b))
    assert store.size() == (2, 2 * one)
    assert store.fetch(b"key-a", 60) is a  # the stored object itself: shared, never copied
    store.keep(b"key-c", "t", c, size(c))  # does not fit: the least recently used (b) goes
    assert store.fetch(b"key-b", 60) is None and store.fetch(b"key-a", 60) is a and store.fetch(b"key-c", 60) is c
    assert store.bytes == 2 * one <= store.max_bytes
    assert store.evictions == 1 and evicted == [1]
    store.keep(b"key-a", "t", c, size(c))  # stored again under one key: counted once
    assert store.size() == (2, 2 * one)
    store.keep(b"huge", "t", entry(b"h" * 2000), 2000 + OVERHEAD)  # larger than the whole bound
    assert store.fetch(b"huge", 60) is None and store.size()[0] == 2
    now[0] = 61.0
    assert store.fetch(b"key-a", 60) is None and store.size() == (1, one)  # expired


def test_an_entry_of_events_is_held_encoded_and_served_decoded() -> None:
    store = MemoryStore(1 << 20)
    stored = entry(text="x" * 1000)
    raw = dump(stored)
    store.keep(b"key", "t", raw, len(raw))
    assert store.entries[b"key"].entry is raw  # its encoding, not its objects
    assert store.size() == (1, len(raw) + 3 + SLOT)
    assert store.fetch(b"key", 60) == stored


def test_events_of_leaves_a_stored_entry_as_it_was() -> None:
    stored = entry(ANSWER)
    replayed = events_of(stored)
    assert replayed is not stored and replayed.events[0][0].text == "hi"
    assert stored.events == [] and stored.body is not None


def test_no_request_changes_the_entry_it_was_answered_with(upstream: Upstream, tmp_path: Path) -> None:
    with serve_config(tmp_path, config(upstream)) as gw, client(gw.url) as c:
        admin = {"authorization": f"Bearer {ADMIN}"}
        first = c.post("/v1/completions", json=body("shared: the cat", logprobs=2))
        assert first.headers["x-gateway-cache"] == "miss"
        held = c.get("/admin/status", headers=admin).json()["cache"]
        # A stream, a batch and a buffered request served from it (each reads its choices its own way) ...
        resp, events = streamed(c, body("shared: the cat", logprobs=2))
        assert resp.headers["x-gateway-cache"] == "hit"
        assert "".join(ch["text"] for event in choices_of(events) for ch in event) == first.json()["choices"][0]["text"]
        batch = c.post("/v1/completions", json=body("", logprobs=2) | {"prompt": ["shared: the cat", "shared: a mat"]})
        assert batch.status_code == 200 and batch.headers["x-gateway-cache"] == "miss"
        assert len(upstream.received) == 2  # the batch asked only for its other prompt
        assert batch.json()["choices"][0] == first.json()["choices"][0]
        again = c.post("/v1/completions", json=body("shared: the cat", logprobs=2))
        # ... leave it as stored: the same choices, and the store counts what it did.
        assert again.headers["x-gateway-cache"] == "hit"
        assert json.dumps(again.json()["choices"]) == json.dumps(first.json()["choices"])
        after = c.get("/admin/status", headers=admin).json()["cache"]
        assert after["memory_entries"] == held["memory_entries"] + 1  # the batch's other prompt
        one = c.post("/v1/completions", json=body("shared: a mat", logprobs=2))
        assert one.headers["x-gateway-cache"] == "hit"
        assert one.json()["choices"][0]["text"] == batch.json()["choices"][1]["text"]
        assert one.json()["choices"][0]["index"] == 0


@pytest.mark.parametrize("stream", [False, True], ids=["buffered", "streamed"])
def test_a_reload_that_shortens_ttl_s_holds_at_once_for_what_memory_holds(
    upstream: Upstream, tmp_path: Path, stream: bool
) -> None:
    with serve_config(tmp_path, config(upstream)) as gw, client(gw.url) as c:
        payload = body(f"ttl: shortened {stream}")
        stored = time.monotonic()
        assert c.post("/v1/completions", json=payload).headers["x-gateway-cache"] == "miss"
        assert c.post("/v1/completions", json=payload).headers["x-gateway-cache"] == "hit"
        path = next(tmp_path.glob("gw-*.yaml"))
        text = path.read_text()
        assert "cache: {mode: deterministic}" in text
        _reload(gw, path, text.replace("cache: {mode: deterministic}", "cache: {mode: deterministic, ttl_s: 1}"))
        time.sleep(max(0.0, stored + 1.5 - time.monotonic()))  # older than the new ttl_s, by a margin
        again = c.post("/v1/completions", json=payload | {"stream": stream})
        assert again.status_code == 200, again.text
        assert again.headers["x-gateway-cache"] == "miss"
    assert len(upstream.received) == 2
