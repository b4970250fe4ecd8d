"""An answer settled at its end-of-stream event (`Response.settle`): the reader stops there, and its connection
is pooled if the rest of the body (the chunked framing's last chunk) comes at once, else closed, without the
reader waiting for either. Against a real aiohttp loopback server."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from gateway.upstream import h1, h1response
from tests.e2e.test_h1_client import Handler, Server, call, server

__all__ = ["server"]  # the fixture, shared with test_h1_client

EVENTS = b"data: {}\n\ndata: [DONE]\n\n"


def upstream(after: float, tail: bytes = b"") -> tuple[Handler, asyncio.Event]:
    """A stream of two events; after them it waits `after` seconds (and sends `tail`) before its body ends. The
    event is set when the handler is done, or failed writing to a connection the client closed."""
    gone = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await resp.write(EVENTS)
            await asyncio.sleep(after)
            if tail:
                await resp.write(tail)
                await asyncio.sleep(after)
            await resp.write_eof()
        finally:
            gone.set()
        return resp

    return handler, gone


async def settled(client: h1.Client, url: str) -> None:
    resp = await call(client, url)
    async for chunk in resp.iter_chunks():
        if b"[DONE]" in chunk:
            break
    resp.settle()


async def test_the_rest_of_the_body_arriving_at_once_pools_the_connection(server: Server) -> None:
    server.handler, gone = upstream(0.05)
    client = h1.Client(4)
    try:
        await settled(client, server.url + "/")
        await asyncio.wait_for(gone.wait(), 2)
        await asyncio.sleep(0.05)
        server.handler, _ = upstream(0)
        await settled(client, server.url + "/")
        assert len(server.peers) == 2 and server.peers[0] == server.peers[1]  # the same connection, reused
    finally:
        client.close()


async def test_a_body_held_open_after_the_end_is_closed_within_the_settle_time(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(h1response, "SETTLE_S", 0.2)
    server.handler, gone = upstream(30)
    client = h1.Client(4)
    try:
        started = asyncio.get_running_loop().time()
        await settled(client, server.url + "/")
        assert asyncio.get_running_loop().time() - started < 1  # the reader did not wait
        (pool,) = client.pools.values()
        assert pool.open == 1 and not pool.idle  # held for the rest of the body
        await asyncio.sleep(0.4)
        assert pool.open == 0  # closed once the settle time ran out
        server.handler, _ = upstream(0)
        await settled(client, server.url + "/")
        assert server.peers[0] != server.peers[1]
    finally:
        client.close()


async def test_more_than_framing_after_the_end_closes_the_connection(server: Server) -> None:
    server.handler, gone = upstream(0.01, b"x" * (h1response.SETTLE_BYTES + 1))
    client = h1.Client(4)
    try:
        await settled(client, server.url + "/")
        await asyncio.wait_for(gone.wait(), 2)
        server.handler, _ = upstream(0)
        await settled(client, server.url + "/")
        assert server.peers[0] != server.peers[1]
    finally:
        client.close()
