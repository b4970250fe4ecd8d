"""Draining a replica with a stream open on it, and the token-native fields relayed plain and streamed."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
from aiohttp import web

from tests.helpers.servers import serve_config
from tests.helpers.upstreams import Received, Upstream
from tests.helpers.waiting import wait_for, wait_until

from .conftest import answering, completion, fleet_config, served

ADMIN = {"authorization": "Bearer admin-fleet-key"}


def chunk(text: str, **choice: object) -> bytes:
    event = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
    event["choices"] = [{"index": 0, "text": text, "logprobs": None, "finish_reason": None, **choice}]
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def test_a_draining_replica_takes_no_new_requests_and_its_stream_finishes(
    tmp_path: Path, replicas: list[Upstream]
) -> None:
    release = threading.Event()

    async def held_stream(request: web.Request, received: Received) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chunk("first "))
        assert await wait_for(release, 10)
        await resp.write(chunk("second"))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    for u in replicas:
        u.handler = held_stream
    with serve_config(tmp_path, fleet_config(replicas, "policy: round_robin")) as gw:
        with httpx.Client(trust_env=False, timeout=15) as c:
            body = {"model": "engine/m", "prompt": "p", "stream": True}
            with c.stream("POST", f"{gw.url}/v1/completions", json=body) as stream:
                lines = stream.iter_lines()
                assert "first" in next(line for line in lines if line.startswith("data:"))
                busy = next(i for i, n in enumerate(served(replicas)) if n)
                r = c.post(f"{gw.url}/admin/providers/engine/replicas/{busy}/drain", headers=ADMIN)
                assert r.status_code == 200 and r.json()["replicas"][busy]["draining"] is True
                for u in replicas:
                    u.handler = answering()
                before = served(replicas)[busy]
                for n in range(6):
                    assert c.post(f"{gw.url}/v1/completions", json={"model": "engine/m", "prompt": f"{n}"}).is_success
                assert served(replicas)[busy] == before  # no new request went to the draining replica
                status = c.get(f"{gw.url}/admin/status", headers=ADMIN).json()
                assert [r["draining"] for r in status["fleets"]["engine"]] == [i == busy for i in range(3)]
                assert {t["target"] for t in status["targets"]} >= {f"engine@{i}/m" for i in range(3)}
                release.set()
                rest = "".join(line for line in lines)
            assert "second" in rest and "[DONE]" in rest  # the open stream finished on the draining replica
            assert c.post(f"{gw.url}/admin/providers/engine/replicas/{busy}/undrain", headers=ADMIN).is_success
            # Back in rotation (a request or two may go elsewhere while the pool's first call to it settles).
            wait_until(
                lambda: (
                    c.post(f"{gw.url}/v1/completions", json={"model": "engine/m", "prompt": "n"}).is_success
                    and served(replicas)[busy] > before
                ),
                timeout=5,
                interval=0.05,
            )
            # Every replica draining: a clear 503, no upstream call; a bad index names it; no key, no admin.
            for i in range(3):
                assert c.post(f"{gw.url}/admin/providers/engine/replicas/{i}/drain", headers=ADMIN).is_success
            r = c.post(f"{gw.url}/v1/completions", json={"model": "engine/m", "prompt": "x"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "replicas_draining"
            r = c.post(f"{gw.url}/admin/providers/engine/replicas/7/drain", headers=ADMIN)
            assert r.status_code == 400 and r.json()["error"]["param"] == "index"
            r = c.post(f"{gw.url}/admin/providers/nowhere/replicas/0/drain", headers=ADMIN)
            assert r.status_code == 404
            assert (r.json()["error"]["type"], r.json()["error"]["param"]) == ("not_found_error", "name")
            assert c.post(f"{gw.url}/admin/providers/engine/replicas/0/undrain").status_code == 401


def test_drain_set_in_config(tmp_path: Path, replicas: list[Upstream]) -> None:
    listed = f"{replicas[0].url}/v1, {{url: {replicas[1].url}/v1, drain: true}}, {replicas[2].url}/v1"
    with serve_config(tmp_path, fleet_config(replicas, "policy: round_robin", replicas=listed)) as gw:
        with httpx.Client(trust_env=False, timeout=15) as c:
            for n in range(6):
                assert c.post(f"{gw.url}/v1/completions", json={"model": "engine/m", "prompt": f"{n}"}).is_success
    assert served(replicas) == [3, 0, 3]


TOKENS = {"token_ids": [11, 12], "prompt_token_ids": [1, 2, 3], "stop_reason": 42}


def test_token_native_fields_plain_streamed_and_refused(tmp_path: Path, replicas: list[Upstream]) -> None:
    async def native(request: web.Request, received: Received) -> web.StreamResponse:
        if not received.json().get("stream"):
            return web.Response(body=completion("hi", **TOKENS), content_type="application/json")
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chunk("h", token_ids=[11], prompt_token_ids=[1, 2, 3]))
        await resp.write(chunk("i", token_ids=[12], finish_reason="stop", stop_reason=42))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def sglang(request: web.Request, received: Received) -> web.StreamResponse:
        body = completion("hi", token_ids=[5], prompt_token_ids=[9], matched_stop="\n")
        return web.Response(body=body, content_type="application/json")

    for u in replicas:
        u.handler = native
    side = Upstream()
    side.start()
    side.handler = sglang
    extra = f"""  hosted: {{kind: openai, api_key: sk-x, base_url: {side.url}/v1}}
  sg: {{kind: sglang, base_url: {side.url}/v1, discover: false}}
"""
    try:
        with serve_config(tmp_path, fleet_config(replicas, "policy: prefix", extra=extra)) as gw:
            with httpx.Client(trust_env=False, timeout=15) as c:
                url = f"{gw.url}/v1/completions"
                native_fields = {"return_token_ids": True, "cache_salt": "tenant-a", "priority": -1}
                r = c.post(url, json={"model": "engine/m", "prompt": [1, 2, 3], **native_fields})
                choice = r.json()["choices"][0]
                assert choice["token_ids"] == [11, 12] and choice["prompt_token_ids"] == [1, 2, 3]
                assert "stop_reason" not in choice  # only when asked for
                sent = next(u for u in replicas if u.received).received[-1].json()
                assert sent["prompt"] == [1, 2, 3] and {k: sent[k] for k in native_fields} == native_fields
                assert "include_stop_reason" not in sent
                r = c.post(url, json={"model": "engine/m", "prompt": "p", "include_stop_reason": True})
                assert r.json()["choices"][0]["stop_reason"] == 42
                body = {"model": "engine/m", "prompt": "p", "stream": True, "return_token_ids": True}
                body["include_stop_reason"] = True
                with c.stream("POST", url, json=body) as s:
                    events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
                ids = [e["choices"][0]["token_ids"] for e in events if e["choices"]]
                assert ids == [[11], [12]] and events[0]["choices"][0]["prompt_token_ids"] == [1, 2, 3]
                assert events[1]["choices"][0]["stop_reason"] == 42
                r = c.post(
                    url, json={"model": "sg/m", "prompt": "p", "return_token_ids": True, "include_stop_reason": True}
                )
                choice = r.json()["choices"][0]
                assert (choice["token_ids"], choice["prompt_token_ids"], choice["stop_reason"]) == ([5], [9], "\n")
                # Elsewhere the field is refused, naming it; a malformed salt never reaches an engine.
                r = c.post(url, json={"model": "hosted/davinci-002", "prompt": "p", "return_token_ids": True})
                assert r.status_code == 400 and r.json()["error"]["param"] == "return_token_ids"
                r = c.post(url, json={"model": "sg/m", "prompt": "p", "return_tokens_as_token_ids": True})
                assert r.status_code == 400 and r.json()["error"]["param"] == "return_tokens_as_token_ids"
                for salt in ("", "a b", "x" * 300, 5):
                    r = c.post(url, json={"model": "engine/m", "prompt": "p", "cache_salt": salt})
                    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", salt
        assert len(side.received) == 1
    finally:
        side.stop()
