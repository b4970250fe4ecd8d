"""The httpx transport's sockets: what an upstream sends before its answer's head is capped, as under h1.

httpcore's HTTP/1.1 parser (h11) skips interim `1xx` answers and reads on, and no hook of httpcore's fires per
interim answer (its trace events wrap the whole head), so an upstream sending them without end would hold a
request until `total_ms`, parsed one by one. Counted off the socket instead, the bytes a request reads until
its final head (interim answers, status line, headers; a proxy's CONNECT answer), and the interim answers
among them, stop at a `HeadMeter`'s limits with h1's `TooLarge`, read `HEAD_STEP` at a time so the loop serves
other requests between steps. `HEAD` is set for the head alone: a read of the body costs a lookup and a call.
HTTP/2 connections go unmetered: one request's task reads every stream's frames, so they cannot be charged
per request (an interim flood there ends at `total_ms`).
"""

from __future__ import annotations

import re
import ssl
from contextvars import ContextVar
from typing import Final

import httpcore
import httpx

from gateway.fleet.metered import ThroughNetwork, ThroughStream
from gateway.upstream.h1wire import _head_too_large, _too_many_interim

# The most one socket read takes while a head is read (a real head is a few hundred bytes): a flood of interim
# answers is parsed this much at a time, and the cap is overshot by less than this.
HEAD_STEP: Final = 4 * 1024
_HEAD_END: Final = re.compile(rb"\n\r?\n")


class HeadMeter:
    """The bytes one request has read before its final head, against `limit` (past it, `cap` is the one named),
    and the interim answers among them, against `interim`."""

    __slots__ = ("cap", "limit", "taken", "interim", "heads", "pending", "final")

    def __init__(self, cap: int, limit: int, interim: int) -> None:
        self.cap = cap
        self.limit = limit
        self.taken = 0
        self.interim = interim
        self.heads = 0  # interim answers whose head ended
        self.pending = b""  # a head not ended yet (within the byte cap)
        self.final = False  # a head that is no interim answer ended: what follows is its body

    def count(self, data: bytes) -> None:
        """Take in `data`, up to the end of the first head that is not an interim answer's; a head ends at an
        empty line, however h11 lets its lines end (CRLF, or a bare LF)."""
        if self.final:
            return
        pending = self.pending
        text = pending + data if pending else data
        start = 0
        # From where an end may begin that `pending` did not hold whole: a head held back is not scanned again.
        for end in _HEAD_END.finditer(text, max(len(pending) - 2, 0)):
            if not (text.startswith(b"HTTP/", start) and text[start + 9 : start + 10] == b"1"):  # HTTP/1.1 1xx
                self.final, self.pending = True, b""
                return
            self.heads += 1
            start = end.end()
        self.pending = text[start:]

    def restart(self) -> None:
        """A tunnel's TLS begins: the proxy's answer to CONNECT, counted so far, was no interim answer."""
        self.heads, self.pending, self.final = 0, b"", False


# Set by the transport around the wait for a head: httpcore reads an HTTP/1.1 connection only in the task of
# the request on it, so the task's value is that request's meter.
HEAD: ContextVar[HeadMeter | None] = ContextVar("httpx_head_meter", default=None)


class _Stream(ThroughStream):
    __slots__ = ()

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        meter = HEAD.get()
        if meter is None:
            return await self._inner.read(max_bytes, timeout)
        # Checked before reading, not after: a read that completes the head may bring body bytes too, and h11
        # asks for no more once it has the head, so only a head still unfinished past the cap is refused.
        if meter.taken > meter.limit:
            raise _head_too_large(meter.cap)
        data = await self._inner.read(min(max_bytes, HEAD_STEP), timeout)
        meter.taken += len(data)
        meter.count(data)
        if meter.heads > meter.interim:  # refused as h1 refuses it, whatever came after it in this read
            raise _too_many_interim(meter.interim)
        return data

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        tls = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        meter = HEAD.get()
        if meter is not None:
            meter.restart()
        ssl_object = tls.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
            return tls  # multiplexed: see the module's docstring
        return _Stream(tls)


class _Network(ThroughNetwork):
    stream = _Stream


def meter_heads(client: httpx.AsyncClient) -> None:
    """Put the meter under every pool of `client`: its own and one per proxy it routes through.

    httpx takes no network backend, so each pool's (httpcore's `_network_backend`, read when a connection opens)
    is wrapped before the first request. Private attributes: tests/security/test_transport_httpx_interim.py
    floods each kind of pool, so an upgrade that moves them fails the suite, and a missing one fails here.
    """
    for transport in (client._transport, *client._mounts.values()):
        if transport is None:
            continue  # NO_PROXY: the client's own transport serves it
        if not isinstance(transport, httpx.AsyncHTTPTransport):
            raise TypeError(f"an httpx transport of an unexpected kind: {type(transport).__name__}")
        pool = transport._pool
        pool._network_backend = _Network(pool._network_backend)
