"""The cache's memory is the memory it counts: the gateway as a child process, whose resident set is read from
/proc, against the bytes `GET /admin/status` says the memory store holds; and a stream too large to store
holds none of its bytes while it runs. The per-entry constants the count uses are measured here too."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from aiohttp import web

from gateway.cache.entry import OVERHEAD, VERSION, Entry, dump, size
from gateway.cache.store import SLOT, MemoryStore
from tests.helpers.servers import GatewayProcess
from tests.helpers.upstreams import Received, Upstream
from wire.schema import Choice, Usage

from .conftest import ADMIN, ALICE, MODEL, config

AUTH = {"authorization": f"Bearer {ALICE}"}

# Each streamed answer: this many chunks of one short token each, the shape that costs most per byte counted.
CHUNKS = 600
STREAMS = 600
# What the resident set may grow by, per byte the memory store counts (the rest is the allocator's slack).
FACTOR = 1.5


def _event(text: str, finish: str | None = None) -> bytes:
    chunk = {"id": "cmpl-m", "object": "text_completion", "created": 1, "model": MODEL}
    chunk["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _stream(tag: str, chunks: int, width: int) -> bytes:
    """A whole stream of `chunks` chunks of `width` characters or so each (sent in one write: the upstream
    costs the test nothing)."""
    pad = "x" * max(width - 6, 0)
    events = [_event(f" w{tag}{i % 1000:03d}{pad}") for i in range(chunks - 1)]
    usage = {"prompt_tokens": 3, "completion_tokens": chunks, "total_tokens": chunks + 3}
    tail = {"id": "cmpl-m", "object": "text_completion", "created": 1, "model": MODEL, "choices": [], "usage": usage}
    return b"".join([*events, _event(" end", "stop"), b"data: " + json.dumps(tail).encode() + b"\n\n"])


def streaming(chunks: int, width: int = 6) -> Any:
    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        body = _stream(str(len(received.body) % 7), chunks, width)
        return web.Response(body=body + b"data: [DONE]\n\n", headers={"content-type": "text/event-stream"})

    return handler


def _status(pid: int) -> dict[str, int]:
    """The process's memory figures from /proc (`VmRSS`, `VmHWM`: its peak), in bytes."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0]) * 1024
    return out


@pytest.fixture
def child(upstream: Upstream, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[GatewayProcess]:
    cache = getattr(request, "param", "cache: {mode: deterministic, max_bytes: 1073741824}")
    text = config(upstream, "logging: {requests: false}").replace("cache: {mode: deterministic}", cache)
    path = tmp_path / "gw.yaml"
    path.write_text(text)
    gw = GatewayProcess(path)
    try:
        gw.wait_ready()
        yield gw
    finally:
        gw.stop()


async def _streams(url: str, prompts: list[str], concurrency: int = 8) -> None:
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60, limits=limits, trust_env=False) as c:
        todo = iter(prompts)

        async def worker() -> None:
            for prompt in todo:
                payload = {"model": MODEL, "prompt": prompt, "max_tokens": CHUNKS, "temperature": 0, "stream": True}
                async with c.stream("POST", "/v1/completions", json=payload) as resp:
                    assert resp.status_code == 200
                    async for _ in resp.aiter_raw():
                        pass

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def _held(url: str) -> int:
    with httpx.Client(base_url=url, trust_env=False, timeout=10) as c:
        resp = c.get("/admin/status", headers={"authorization": f"Bearer {ADMIN}"})
    return int(resp.json()["cache"]["memory_bytes"])


def test_the_resident_set_grows_by_what_the_memory_store_counts(upstream: Upstream, child: GatewayProcess) -> None:
    upstream.handler = streaming(CHUNKS)
    pid = child.proc.pid
    asyncio.run(_streams(child.url, [f"held: warm {i}" for i in range(100)]))  # code and buffers in use
    counted0, rss0 = _held(child.url), _status(pid)["VmRSS"]
    asyncio.run(_streams(child.url, [f"held: stored {i}" for i in range(STREAMS)]))
    counted, rss = _held(child.url) - counted0, _status(pid)["VmRSS"] - rss0
    # Every answer stored: each counts at least its chunks' text.
    assert counted >= STREAMS * CHUNKS * 5, counted
    assert rss <= FACTOR * counted, (rss, counted, rss / counted)


@pytest.mark.parametrize("child", ["cache: {mode: deterministic, max_entry_bytes: 1048576}"], indirect=True)
def test_a_stream_too_large_to_store_holds_none_of_its_bytes(upstream: Upstream, child: GatewayProcess) -> None:
    big = 40_000  # chunks of 1,000 characters: about 45 MB of client stream, past `max_entry_bytes` early on
    upstream.handler = streaming(big, 1000)
    pid = child.proc.pid
    asyncio.run(_streams(child.url, ["held: warm"], concurrency=1))  # the code paths in use, a small entry
    before = _status(pid)
    streamed = [0]

    async def one() -> None:
        payload = {"model": MODEL, "prompt": "held: too large", "max_tokens": big, "temperature": 0, "stream": True}
        async with httpx.AsyncClient(base_url=child.url, headers=AUTH, timeout=120, trust_env=False) as c:
            async with c.stream("POST", "/v1/completions", json=payload) as resp:
                assert resp.status_code == 200
                assert resp.headers["x-gateway-cache"] == "miss"
                async for raw in resp.aiter_raw():
                    streamed[0] += len(raw)

    asyncio.run(one())
    after = _status(pid)
    assert streamed[0] > 40_000_000, streamed
    # Its peak stayed far below the stream it relayed and below what an entry may count.
    assert after["VmHWM"] - before["VmRSS"] < 1_048_576 * 8, (after, before)
    assert _held(child.url) < 1_048_576  # only the small entry
    with httpx.Client(base_url=child.url, headers=AUTH, trust_env=False, timeout=10) as c:
        payload = {"model": MODEL, "prompt": "held: too large", "max_tokens": big, "temperature": 0}
        again = c.post("/v1/completions", json=payload, headers={"cache-control": "only-if-cached"})
        assert again.status_code == 504  # not stored


def _measured(make: Any, n: int = 5000) -> tuple[float, float]:
    """What `n` entries made by `make(i)` (the entry or its encoding, its counted size and its key) take in
    memory per entry, as tracemalloc sees it, and what the store counts for each."""
    store = MemoryStore(1 << 40)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(n):
            value, counted, key = make(i)
            store.keep(key, "tag", value, counted)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return grown / n, store.bytes / n


_usage = msgspec.json.Decoder(Usage).decode


def _key(i: int) -> bytes:
    return b"*\x00" + msgspec.msgpack.encode({"model": MODEL, "prompt": f"prompt number {i}", "max_tokens": 50})


def test_an_answer_sent_whole_counts_what_it_holds() -> None:
    def make(i: int) -> tuple[Any, int, bytes]:
        body = b'{"id":"c","choices":[{"index":0,"text":"answer %d","logprobs":null,"finish_reason":"stop"}]}' % i
        model = f"{MODEL}{i}"[: len(MODEL)]  # an object of its own, as each request's decoded model is
        usage = _usage(b'{"prompt_tokens":500,"completion_tokens":700,"total_tokens":1200}')
        entry = Entry(VERSION, 1e9 + i, model, "local", MODEL, usage, [], None, body)
        return entry, size(entry), _key(i)

    held, counted = _measured(make)
    assert held <= counted, (held, counted)
    assert counted <= 1.5 * held, (held, counted)  # and not much more: the count is what it holds


def test_a_streamed_answer_counts_what_it_holds() -> None:
    def make(i: int) -> tuple[Any, int, bytes]:
        events = [[Choice(text=f" w{j}", index=0, logprobs=None, finish_reason=None)] for j in range(50)]
        usage = _usage(b'{"prompt_tokens":500,"completion_tokens":700,"total_tokens":1200}')
        raw = dump(Entry(VERSION, 1e9 + i, f"{MODEL}{i}"[: len(MODEL)], "local", MODEL, usage, events, None))
        return raw, len(raw), _key(i)

    held, counted = _measured(make)
    assert held <= counted <= 1.5 * held, (held, counted)
    assert OVERHEAD > 0 and SLOT > 0
