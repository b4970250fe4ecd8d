"""The httpx transport cannot be turned against the gateway: what it must not do for a hostile upstream.

Over real loopback sockets: follow a redirect with the gateway's key, keep one tenant's cookie for the next,
pass a client's Proxy-* header to the proxy, or pool a connection whose stream was closed early; and the h11
state the transport's wrapper seals stays reachable. What it does that h1 cannot is
tests/security/test_transport_httpx_tls.py.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.config import CapsConfig, parse_config
from gateway.upstream.httpx_transport import HttpxTransport, _h11_state
from tests.security.httpx_rig import ANSWER, TIMEOUTS, Proxy, call, start_origin, upstream_for
from wire.upstream import UpstreamRequest

# --------------------------------------------------------------------------------------------------
# What httpx must not do


async def test_redirects_are_not_followed_cookies_not_kept_and_proxy_headers_not_passed(proxy: Proxy) -> None:
    elsewhere_runner, elsewhere = await start_origin()

    async def hostile(request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/redirect"):
            # Points the gateway, and the credential it sends, at another host.
            raise web.HTTPTemporaryRedirect(f"{elsewhere.url}/steal")
        resp = web.Response(body=ANSWER, content_type="application/json")
        resp.set_cookie("session", "tenant-a-secret", path="/")
        return resp

    runner, origin = await start_origin(handler=hostile)
    try:
        up = upstream_for(f"  x: {{kind: openai, api_key: k, base_url: '{origin.url}/v1', proxy: '{proxy.url}'}}")
        try:
            req = UpstreamRequest("POST", origin.url + "/redirect", {"authorization": "Bearer sk-gw"}, b"{}")
            resp = await up.send("x", req, TIMEOUTS)
            assert resp.status == 307 and elsewhere.seen == []
            # Tenant A's answer sets a cookie; tenant B's request must not carry it.
            await call(up, "x", origin.url, {"proxy-authorization": "Basic c3RvbGVu", "x-tenant": "a"})
            await call(up, "x", origin.url, {"x-tenant": "b"})
        finally:
            await up.close()
        assert [s.headers.get("cookie") for s in origin.seen] == [None, None, None]
        assert all("proxy-authorization" not in h for h in proxy.headers)
        assert all("proxy-authorization" not in s.headers for s in origin.seen)
    finally:
        await runner.cleanup()
        await elsewhere_runner.cleanup()


async def test_a_stream_closed_early_closes_its_connection() -> None:
    hung_up = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path != "/stream":
            return web.Response(body=ANSWER)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: 1\n\n")
        try:
            for _ in range(100):  # keeps writing until the peer is gone (aiohttp raises on a closed transport)
                await asyncio.sleep(0.05)
                await resp.write(b": keep-alive\n\n")
        except (ConnectionError, RuntimeError):
            hung_up.set()
        return resp

    runner, origin = await start_origin(handler=handler)
    try:
        up = upstream_for(f"  s: {{kind: openai, api_key: k, base_url: '{origin.url}/v1', transport: httpx}}")
        try:
            req = UpstreamRequest("POST", origin.url + "/stream", {}, b"{}", stream=True)
            stream = await up.open_stream("s", req, TIMEOUTS)
            assert stream.status == 200
            stream.close()  # as the pipeline does when the client leaves before the first event is read
            await asyncio.wait_for(hung_up.wait(), 3)  # the upstream saw the connection go
            assert await call(up, "s", origin.url) == (200, ANSWER)
        finally:
            await up.close()
        assert origin.seen[0].peer != origin.seen[1].peer  # the half-read connection was not reused
    finally:
        await runner.cleanup()


async def test_the_h11_state_the_wrapper_seals_is_still_reachable() -> None:
    """`_seal` keeps a connection with leftover bytes out of the pool through httpx/httpcore internals;
    this fails if an upgrade moves them, rather than letting that protection lapse silently."""
    runner, origin = await start_origin()
    try:
        t = HttpxTransport(
            parse_config("providers: {p: {kind: openai, api_key: k}}", env={}).providers["p"], CapsConfig()
        )
        try:
            reply = await t.request(UpstreamRequest("POST", origin.url + "/", {}, b"{}"), TIMEOUTS)
            assert _h11_state(reply._resp) is not None
            assert await reply.read() == ANSWER
        finally:
            await t.close()
    finally:
        await runner.cleanup()
