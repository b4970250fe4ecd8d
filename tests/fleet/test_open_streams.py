"""An open stream counts in flight on its replica until it ends: least outstanding and the prefix policy's
load bound see long streams, and the count goes back to 0 when a stream ends or its client leaves."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from aiohttp import web

from tests.helpers.servers import serve_config
from tests.helpers.upstreams import Handler, Received, Upstream
from tests.helpers.waiting import wait_for, wait_until

from .conftest import completion, fleet_config, served

ADMIN = {"authorization": "Bearer admin-fleet-key"}
PREFIX = "You are grading answers. Example: the sky is blue because of Rayleigh scattering. " * 20


def chunk(text: str, finish: str | None = None) -> bytes:
    event = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
    event["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def holding(release: threading.Event, gone: threading.Event | None = None) -> Handler:
    """Streams its first event and holds the stream open until `release`; answers unstreamed at once."""

    async def handler(request: web.Request, received: Received) -> web.StreamResponse:
        if not received.json().get("stream"):
            return web.Response(body=completion(), content_type="application/json")
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chunk("first "))
        try:
            await wait_for(release, 10)
            await resp.write(chunk("second", "stop"))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except BaseException:
            if gone is not None:
                gone.set()
            raise
        return resp

    return handler


@contextmanager
def open_stream(c: httpx.Client, url: str, prompt: str = "p") -> Iterator[tuple[httpx.Response, Iterator[str]]]:
    """A stream opened through the gateway and read to its first event (then held by the upstream)."""
    body = {"model": "engine/m", "prompt": prompt, "stream": True}
    with c.stream("POST", f"{url}/v1/completions", json=body) as stream:
        lines = stream.iter_lines()
        assert "first" in next(line for line in lines if line.startswith("data:"))
        yield stream, lines


def ask(c: httpx.Client, url: str, prompt: str = "q") -> int:
    """One unstreamed request: the replica that served it."""
    r = c.post(f"{url}/v1/completions", json={"model": "engine/m", "prompt": prompt})
    assert r.status_code == 200
    return int(r.headers["x-gateway-model"].split("@")[1].split("/")[0])


def inflight(c: httpx.Client, url: str) -> dict[str, int]:
    status = c.get(f"{url}/admin/status", headers=ADMIN).json()
    return {t["target"]: t["inflight"] for t in status["targets"] if t["target"].startswith("engine@")}


def test_an_open_stream_keeps_least_outstanding_off_its_replica(tmp_path: Path, replicas: list[Upstream]) -> None:
    two = replicas[:2]
    release, gone = threading.Event(), threading.Event()
    for u in two:
        u.handler = holding(release, gone)
    with serve_config(tmp_path, fleet_config(two, "policy: least_outstanding")) as gw:
        with httpx.Client(trust_env=False, timeout=15) as c:
            with open_stream(c, gw.url) as (stream, lines):
                busy = int(stream.headers["x-gateway-model"].split("@")[1].split("/")[0])
                # The stream is past its first event and still open: it counts, so every request goes to the other.
                assert [ask(c, gw.url) for _ in range(4)] == [1 - busy] * 4
                assert inflight(c, gw.url) == {f"engine@{busy}/m": 1, f"engine@{1 - busy}/m": 0}
                assert ask(c, gw.url) == 1 - busy
                release.set()
                rest = "".join(lines)
            assert "second" in rest and "[DONE]" in rest and "error" not in rest
            # Ended normally: the count is back to 0, and the replica that held it takes requests again.
            wait_until(lambda: set(inflight(c, gw.url).values()) == {0})
            assert busy in {ask(c, gw.url) for _ in range(4)}

            # A client that leaves mid-stream gives the count back too.
            release.clear()
            with open_stream(c, gw.url) as (stream, _):
                busy = int(stream.headers["x-gateway-model"].split("@")[1].split("/")[0])
                assert inflight(c, gw.url)[f"engine@{busy}/m"] == 1
            # Leaving the block closed the connection before the stream ended: the upstream stream is let go
            # and the count is back to 0, so the next stream is again the only one counted.
            wait_until(gone.is_set)
            wait_until(lambda: set(inflight(c, gw.url).values()) == {0})
            with open_stream(c, gw.url) as (stream, _):
                busy = int(stream.headers["x-gateway-model"].split("@")[1].split("/")[0])
                assert inflight(c, gw.url) == {f"engine@{busy}/m": 1, f"engine@{1 - busy}/m": 0}
                assert ask(c, gw.url) == 1 - busy
                release.set()


def test_open_streams_spill_a_hot_prefix_over_the_load_bound(tmp_path: Path, replicas: list[Upstream]) -> None:
    two = replicas[:2]
    release = threading.Event()
    for u in two:
        u.handler = holding(release)
    hot = PREFIX + " question 1?"
    with serve_config(tmp_path, fleet_config(two, "policy: prefix, epsilon: 0.25")) as gw:
        with httpx.Client(trust_env=False, timeout=15) as c, httpx.Client(trust_env=False, timeout=15) as c2:
            home = ask(c, gw.url, hot)
            assert ask(c, gw.url, hot) == home  # the prefix has a home replica
            with open_stream(c, gw.url, hot) as (s1, _), open_stream(c2, gw.url, hot) as (s2, _):
                # Both open streams went home (2 in flight there is under ceil(1.25 x 2 / 2) = 2 counting each).
                assert {s.headers["x-gateway-model"] for s in (s1, s2)} == {f"engine@{home}/m"}
                before = served(two)
                # Home holds two open streams: ceil(1.25 x 3 / 2) = 2 is its bound, so the prefix spills.
                assert ask(c, gw.url, hot) == 1 - home
                assert served(two)[1 - home] == before[1 - home] + 1
                release.set()


def test_a_resumed_stream_counts_on_the_replica_that_took_it_over(tmp_path: Path, replicas: list[Upstream]) -> None:
    two = replicas[:2]
    cut, release = threading.Event(), threading.Event()

    async def breaking(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        if "first " not in received.json()["prompt"]:  # the original request: it breaks when told
            await resp.write(chunk("first "))
            await wait_for(cut, 10)
            await asyncio.sleep(0.05)
            assert request.transport is not None
            request.transport.abort()
            return resp
        await resp.write(chunk("more "))  # the continuation: held open until released
        await wait_for(release, 10)
        await resp.write(chunk("end", "stop"))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    for u in two:
        u.handler = breaking
    extra = "models:\n  - {name: resumed, targets: [{model: engine/m}], resume_streams: true}\n"
    with serve_config(tmp_path, fleet_config(two, "policy: least_outstanding", extra=extra)) as gw:
        with httpx.Client(trust_env=False, timeout=15) as c:
            body = {"model": "resumed", "prompt": "p", "stream": True}
            with c.stream("POST", f"{gw.url}/v1/completions", json=body) as stream:
                lines = stream.iter_lines()
                assert "first" in next(line for line in lines if line.startswith("data:"))
                broke = int(stream.headers["x-gateway-model"].split("@")[1].split("/")[0])
                assert inflight(c, gw.url) == {f"engine@{broke}/m": 1, f"engine@{1 - broke}/m": 0}
                cut.set()
                assert "more" in next(line for line in lines if line.startswith("data:"))
                # The broken part gave its count back; the continuation counts on the replica serving it.
                assert inflight(c, gw.url) == {f"engine@{broke}/m": 0, f"engine@{1 - broke}/m": 1}
                release.set()
                rest = "".join(lines)
            assert "end" in rest and "[DONE]" in rest and "error" not in rest
            wait_until(lambda: set(inflight(c, gw.url).values()) == {0})


def test_a_hedged_stream_counts_on_the_winner_only(tmp_path: Path, replicas: list[Upstream]) -> None:
    two = replicas[:2]
    release = threading.Event()
    calls: list[int] = []
    lock = threading.Lock()

    async def slow_first(request: web.Request, received: Received) -> web.StreamResponse:
        with lock:
            calls.append(1)
            primary = len(calls) == 1
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        if primary:  # the first attempt has no event before the hedge starts (and then loses)
            await wait_for(release, 10)
        await resp.write(chunk("first "))
        await wait_for(release, 10)
        await resp.write(chunk("end", "stop"))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    for u in two:
        u.handler = slow_first
    extra = "models:\n  - {name: hedged, targets: [{model: engine/m}], hedge_after_ms: 100}\n"
    with serve_config(tmp_path, fleet_config(two, "policy: least_outstanding", extra=extra)) as gw:
        with httpx.Client(trust_env=False, timeout=15) as c:
            body = {"model": "hedged", "prompt": "p", "stream": True}
            with c.stream("POST", f"{gw.url}/v1/completions", json=body) as stream:
                lines = stream.iter_lines()
                assert "first" in next(line for line in lines if line.startswith("data:"))
                assert stream.headers["x-gateway-attempts"] == "2"
                won = int(stream.headers["x-gateway-model"].split("@")[1].split("/")[0])
                # The loser was let go when the winner's first event came; the winner counts while open.
                wait_until(lambda: inflight(c, gw.url) == {f"engine@{won}/m": 1, f"engine@{1 - won}/m": 0})
                release.set()
                rest = "".join(lines)
            assert "end" in rest and "[DONE]" in rest and "error" not in rest
            wait_until(lambda: set(inflight(c, gw.url).values()) == {0})


def test_least_busy_sees_an_open_stream(tmp_path: Path, replicas: list[Upstream]) -> None:
    release = threading.Event()
    for u in replicas:
        u.handler = holding(release)
    fleet, solo = replicas[:2], replicas[2]
    extra = f"""  solo: {{kind: vllm, base_url: {solo.url}/v1, discover: false, models: [m]}}
models:
  - {{name: busy, strategy: least-busy, targets: [{{model: engine/m}}, {{model: solo/m}}]}}
"""
    with serve_config(tmp_path, fleet_config(fleet, "policy: least_outstanding", extra=extra)) as gw:
        with httpx.Client(trust_env=False, timeout=15) as c:
            body = {"model": "busy", "prompt": "p", "stream": True}
            with c.stream("POST", f"{gw.url}/v1/completions", json=body) as stream:
                lines = stream.iter_lines()
                assert "first" in next(line for line in lines if line.startswith("data:"))
                assert stream.headers["x-gateway-model"].startswith("engine@")  # a tie: the first target took it
                # The provider holds an open stream: the alias's next requests go to the idle one.
                for _ in range(3):
                    r = c.post(f"{gw.url}/v1/completions", json={"model": "busy", "prompt": "q"})
                    assert r.status_code == 200 and r.headers["x-gateway-model"] == "solo/m"
                release.set()
                assert "[DONE]" in "".join(lines)
