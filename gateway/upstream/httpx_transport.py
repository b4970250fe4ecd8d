"""The httpx transport: proxies, per-provider CA bundles, client certificates (mTLS) and HTTP/2.

For a provider that needs what `gateway.upstream.h1` lacks: one pooled `httpx.AsyncClient` per provider, wrapped to
behave as h1 does (same failure kinds, caps, timeouts, bounded decoding), and configured so it cannot be
turned against tenants (no redirects, no cookies, no credentials from the environment): docs/security.md.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import ssl
import time
import urllib.request
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from typing import Any, Final

import httpx

from gateway.config import CapsConfig, ProviderConfig
from gateway.upstream import h1
from gateway.upstream.h1wire import Failed
from gateway.upstream.httpx_head import HEAD, HeadMeter, meter_heads
from gateway.upstream.transport import Timeouts
from wire.upstream import UpstreamRequest

_KEEPALIVE_S: Final = 30.0  # as h1's pool
_PIECE: Final = 64 * 1024  # decoded output per decompress call: a bomb is never expanded in one go
# httpcore's max_incomplete_event_size for h11: the effective header cap is the lower of it and the config's.
_H11_HEAD_LIMIT: Final = 100 * 1024


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
    """A jar that stores and sends nothing: an empty jar per request would still carry a cookie within one."""

    def set_ok(self, cookie: http.cookiejar.Cookie, request: urllib.request.Request) -> bool:
        return False

    def return_ok(self, cookie: http.cookiejar.Cookie, request: urllib.request.Request) -> bool:
        return False


def tls_context(p: ProviderConfig) -> ssl.SSLContext:
    """The provider's CA bundle (else the system store, as h1 uses) and its client certificate."""
    ctx = ssl.create_default_context(cafile=p.ca_bundle or None)
    if p.client_cert:
        ctx.load_cert_chain(p.client_cert, p.client_key or None)
    return ctx


class _Decoder:
    """gzip or deflate, decoded in bounded pieces so a bomb is never expanded in one call.

    `deflate` is meant to be zlib-wrapped (RFC 9110 8.4.1.2), but some servers send it raw: the first two
    bytes tell them apart, the same test h1 makes.
    """

    def __init__(self, encoding: str) -> None:
        gzip = encoding in ("gzip", "x-gzip")
        self._z = zlib.decompressobj(16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS)
        self._probe: bytes | None = None if gzip else b""

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._probe is not None:
            data = self._probe + data
            if len(data) < 2:
                self._probe = data
                return
            self._probe = None
            cmf, flg = data[0], data[1]
            if cmf & 0x0F != 8 or cmf >> 4 > 7 or (cmf << 8 | flg) % 31:
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
        while data:
            try:
                out = self._z.decompress(data, _PIECE)
            except zlib.error:
                raise h1.Malformed("the response body could not be decompressed") from None
            data = self._z.unconsumed_tail
            if out:
                yield out

    def flush(self) -> bytes:
        try:
            return self._z.flush()
        except zlib.error:
            raise h1.Malformed("the response body could not be decompressed") from None


def _decoder(headers: Mapping[str, str]) -> _Decoder | None:
    encoding = headers.get("content-encoding", "").strip().lower()
    return _Decoder(encoding) if encoding in ("gzip", "x-gzip", "deflate") else None


def _h11_state(resp: httpx.Response) -> Any:
    """The h11 state machine under an HTTP/1.1 response (None for HTTP/2), through httpx's and httpcore's
    stream wrappers. Private attributes: tests/security/test_transport_httpx.py pins the chain, so an
    httpx or httpcore upgrade that moves it fails the suite instead of silently pooling leftovers."""
    node: Any = resp.stream
    for _ in range(8):
        state = getattr(node, "_h11_state", None)
        if state is not None:
            return state
        node = (
            getattr(node, "_stream", None)
            or getattr(node, "_httpcore_stream", None)
            or getattr(node, "_connection", None)
        )
        if node is None:
            return None
    return None


def _seal(resp: httpx.Response) -> None:
    """Keep a connection out of the pool when the server sent, or said it would send, more than the answer.

    httpcore pools a connection once both sides of h11 are DONE, and bytes already received after the
    body (a 204 with a body, a second answer smuggled behind the first) stay in h11's buffer: the next
    request on that connection would read them as its own answer. Failing our side makes httpcore close
    it instead (h11's public `send_failed`).
    """
    state = _h11_state(resp)
    if state is None:
        return
    # A 204 or 304 is bodyless whatever it declares (RFC 9110 15.3.5, 15.4.5): one that declares a body
    # may send it a moment later, when the connection is already back in the pool (as h1 decides).
    declared = resp.status_code in (204, 304) and (
        resp.headers.get("content-length", "0") != "0" or "transfer-encoding" in resp.headers
    )
    if declared or state.trailing_data[0]:
        state.send_failed()


def _framing_problem(resp: httpx.Response) -> h1.Malformed | None:
    """What h1's parser refuses and h11 accepts: two Content-Lengths (equal or not), a list of them, or one
    beside Transfer-Encoding (RFC 9112 6.3: ought to be an error; each is a request-smuggling vector)."""
    lengths = resp.headers.get_list("content-length")
    if len(lengths) > 1 or any("," in v for v in lengths):
        return h1.Malformed("invalid HTTP response: more than one Content-Length")
    if lengths and "transfer-encoding" in resp.headers:
        return h1.Malformed("invalid HTTP response: both Content-Length and Transfer-Encoding")
    return None


def _head_too_large(cap: int) -> h1.TooLarge:
    return h1.TooLarge(f"the response headers are larger than the cap of {cap} bytes (caps.upstream_header_bytes)")


def _head_problem(raw: list[tuple[bytes, bytes]], cap: int) -> h1.TooLarge | None:
    """h1's header caps, counted as h1 counts them (in arrival order), so both refuse the same answers."""
    size = 0
    for count, (name, value) in enumerate(raw, 1):
        size += len(name) + len(value) + 4
        if size > cap:
            return _head_too_large(cap)
        if count > h1.MAX_HEADERS:
            return h1.TooLarge(f"the response has more than {h1.MAX_HEADERS} header fields")
    return None


def _body_too_large(cap: int) -> h1.TooLarge:
    return h1.TooLarge(f"the response body is larger than the cap of {cap} bytes (caps.upstream_body_bytes)")


def _was_reset(exc: BaseException) -> bool:
    """Whether the peer reset the connection, as h1 sees it (httpx wraps the OS error in two layers)."""
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            return False
        if isinstance(seen, ConnectionResetError) or "reset by peer" in str(seen).lower():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _mapped(exc: httpx.HTTPError, began: bool, head_cap: int = _H11_HEAD_LIMIT) -> BaseException:
    """An httpx failure as the failure kind h1 would report for it."""
    if isinstance(exc, httpx.TimeoutException):
        # The cause as h1 names it (wire.errors.CAUSES); httpx bounds a write by first_byte_ms too.
        if isinstance(exc, httpx.ConnectTimeout):
            return TimeoutError("connect_timeout")
        if isinstance(exc, httpx.PoolTimeout):
            return TimeoutError("pool_timeout")
        return TimeoutError("read_timeout" if began else "first_byte_timeout")
    if isinstance(exc, httpx.ConnectError | httpx.ProxyError | httpx.UnsupportedProtocol):
        return h1.ConnectFailed(str(exc), cause=h1.connect_cause(exc))
    if isinstance(exc, httpx.DecodingError):
        return h1.Malformed("the response body could not be decompressed")
    if isinstance(exc, httpx.LocalProtocolError):
        return ValueError(f"the request could not be sent: {exc}")
    text = str(exc)
    if "buffer too long" in text:
        # h11 gives up on a head past 100 KiB (httpcore's limit): over any header cap h1 would apply too.
        return _head_too_large(min(head_cap, _H11_HEAD_LIMIT))
    if not began and (
        isinstance(exc, httpx.ReadError | httpx.WriteError) or "without sending" in text or "disconnected" in text
    ):
        reset = _was_reset(exc)
        return h1.Disconnected(
            "the server closed the connection before answering",
            cause="connection_reset" if reset else "connection_closed",
        )
    if began:
        # A body that stopped (h1: the connection ended mid-body) or one h11 could not parse (h1: llhttp).
        cut = isinstance(exc, httpx.ReadError) or "incomplete" in text or "without sending complete" in text
        return h1.Malformed(
            "the response body was cut short", cause="truncated_response" if cut else "malformed_response"
        )
    return h1.Malformed(f"invalid HTTP response: {text}")


_SPENT: Final = httpx.ByteStream(b"")


async def _close(resp: httpx.Response) -> None:
    """Close `resp`, then let go of its stream. httpx binds the two to each other, and hanging off that cycle a
    closed connection (its network stream, the context it was opened in) would wait for the collector."""
    try:
        await resp.aclose()
    finally:
        resp.stream = _SPENT


class HttpxReply:
    """An httpx response read as h1's is: whole (capped) or chunk by chunk, under the same deadline."""

    def __init__(
        self, transport: HttpxTransport, resp: httpx.Response, deadline: float, read_s: float, limit: int
    ) -> None:
        self._transport = transport
        self._resp = resp
        self.status = resp.status_code
        headers: dict[str, str] = {}
        for key, value in resp.headers.multi_items():
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        self.headers: Mapping[str, str] = headers
        self._deadline = deadline
        self._read_s = read_s
        self._limit = limit
        self._done = False
        self.last_wait = 0.0  # `Reply.last_wait`

    async def _pieces(self) -> AsyncIterator[bytes]:
        decoder = _decoder(self.headers)
        # The transfer-decoded bytes, read here rather than through aiter_raw(), which would close (and so
        # pool) the connection before `_seal` could look at what the server sent after the body.
        stream = self._resp.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        raw = aiter(stream)
        while True:
            now = self.last_wait = time.monotonic()
            remaining = self._deadline - now
            if remaining <= 0:
                raise TimeoutError("total_timeout")
            try:
                async with asyncio.timeout(remaining):
                    data = await anext(raw, None)
            except httpx.HTTPError as exc:
                raise _mapped(exc, began=True) from None
            except TimeoutError:
                raise TimeoutError("total_timeout") from None
            if data is None:
                break
            if decoder is None:
                yield data
                continue
            for i, piece in enumerate(decoder.feed(data)):
                if i:
                    # A bomb's next piece: other requests get the loop first, and the deadline still holds.
                    if time.monotonic() >= self._deadline:
                        raise TimeoutError("total_timeout")
                    await asyncio.sleep(0)
                yield piece
        if decoder is not None:
            tail = decoder.flush()
            if tail:
                yield tail
        _seal(self._resp)
        self._done = True
        await self._resp.aclose()

    async def read(self) -> bytes:
        """The whole body, decoded; `h1.TooLarge` past the cap, counted after decoding (the connection closes)."""
        body = bytearray()
        try:
            length = self.headers.get("content-length")
            if "content-encoding" not in self.headers and length is not None and length.isdigit():
                if int(length) > self._limit:
                    raise _body_too_large(self._limit)
            async for piece in self._pieces():
                body += piece
                if len(body) > self._limit:
                    raise _body_too_large(self._limit)
        finally:
            self.release()
        return bytes(body)

    async def iter_chunks(self, failed: Failed | None = None) -> AsyncGenerator[bytes, None]:
        try:
            async for piece in self._pieces():
                yield piece
        except h1.FAILURES as exc:
            if failed is None:
                raise
            raise failed(exc) from None
        finally:
            self.release()

    def release(self) -> None:
        """Pool the connection only after a whole body; otherwise httpcore closes it on aclose()."""
        if not self._resp.is_closed:
            self._transport.close_later(self._resp)

    def settle(self) -> None:
        self.release()  # closed: httpcore reads no body the caller stopped reading


class HttpxTransport:
    name = "httpx"

    def __init__(self, p: ProviderConfig, caps: CapsConfig) -> None:
        self._caps = caps
        self._client = httpx.AsyncClient(
            verify=tls_context(p),
            http2=p.http2,
            proxy=p.proxy or None,
            # Proxies from HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / NO_PROXY when no `proxy` is set.
            trust_env=True,
            follow_redirects=False,
            cookies=http.cookiejar.CookieJar(policy=_NoCookies()),
            limits=httpx.Limits(
                max_connections=p.max_connections,
                max_keepalive_connections=p.max_connections,
                keepalive_expiry=_KEEPALIVE_S,
            ),
        )
        # Only what h1 would send: no httpx user agent, and compression we decode ourselves.
        for name in ("user-agent", "accept", "connection"):
            self._client.headers.pop(name, None)
        self._client.headers["accept-encoding"] = "gzip, deflate"
        meter_heads(self._client)
        self._closing: set[asyncio.Task[None]] = set()

    def close_later(self, resp: httpx.Response) -> None:
        task = asyncio.ensure_future(_close(resp))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _headers(self, given: Mapping[str, str]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for name, value in given.items():
            lowered = name.lower()
            if h1.hop_by_hop(lowered):
                # httpx frames the request itself, and a client's Proxy-* must never reach the provider's proxy.
                continue
            if "\r" in value or "\n" in value or "\0" in value or "\r" in name or "\n" in name or "\0" in name:
                raise ValueError(f"header {name!r} contains a line break or NUL")
            out.append((name, value))
        return out

    async def request(self, req: UpstreamRequest, timeouts: Timeouts) -> HttpxReply:
        if req.method in ("HEAD", "CONNECT"):
            raise ValueError(f"method {req.method} is not supported")  # as h1: neither frames a body it can relay
        _, target = h1.split(req.url)
        if not target.isprintable() or " " in target or not target.isascii():
            # httpx would percent-encode what h1 refuses; refusing here keeps the two identical.
            raise ValueError("the request target contains spaces, control or non-ASCII characters")
        deadline = time.monotonic() + timeouts.total
        request = self._client.build_request(
            req.method,
            req.url,
            headers=self._headers(req.headers),
            content=req.body,
            timeout=httpx.Timeout(
                connect=timeouts.connect, read=timeouts.first_byte, write=timeouts.first_byte, pool=timeouts.total
            ),
        )
        # h11 skips interim answers without end, so the bytes read until the final head are counted under it
        # (httpx_head.py), from h11's own limit for one head up: below it, h11 and `_head_problem` refuse an
        # oversized head for the reason h1 gives (too many fields before too many bytes).
        cap = self._caps.upstream_header_bytes
        metered = HEAD.set(HeadMeter(cap, max(cap, _H11_HEAD_LIMIT), self._caps.upstream_interim_answers))
        try:
            async with asyncio.timeout(timeouts.total):
                resp = await self._client.send(request, stream=True, follow_redirects=False)
        except httpx.HTTPError as exc:
            raise _mapped(exc, began=False, head_cap=self._caps.upstream_header_bytes) from None
        except TimeoutError:
            raise TimeoutError("total_timeout") from None
        finally:
            HEAD.reset(metered)
        problem = _head_problem(resp.headers.raw, self._caps.upstream_header_bytes) or _framing_problem(resp)
        if problem is not None:
            self.close_later(resp)
            try:
                raise problem
            finally:
                problem = None  # the traceback holds this frame: no cycle through it back to the exception
        return HttpxReply(self, resp, deadline, timeouts.first_byte, self._caps.upstream_body_bytes)

    async def close(self) -> None:
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        await self._client.aclose()
