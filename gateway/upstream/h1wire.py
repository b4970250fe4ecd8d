"""The vocabulary of the h1 client (gateway/upstream/h1.py): its caps, the four failure kinds and their
causes, the watchdog that times a connection's waits, which request headers belong to the connection, and
the origin of a URL.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from collections.abc import Callable, Mapping
from typing import Final
from urllib.parse import urlsplit

from gateway.grace import Grace

# A stream the client reads slower than the upstream writes pauses the socket above this many bytes.
_HIGH_WATER: Final = 1 << 20
_KEEPALIVE_S: Final = 30.0

# Caps; the gateway passes its `caps.*` config, whose defaults these equal.
MAX_BODY: Final = 64 * 1024 * 1024  # caps.upstream_body_bytes
MAX_HEADER_BYTES: Final = 64 * 1024  # caps.upstream_header_bytes
MAX_HEADERS: Final = 200  # header fields (and trailers) in one answer; not configurable
MAX_INTERIM: Final = 10  # caps.upstream_interim_answers

# Request headers a transport owns (framing, connection management) or must never forward: whatever a
# caller passes under these names is dropped. `proxy-*` is matched by prefix (`hop_by_hop`).
_HOP_BY_HOP: Final = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "expect", "te", "trailer", "upgrade"}
)


def hop_by_hop(lowered: str) -> bool:
    """Whether a (lower-cased) request header belongs to the connection, not to the caller: both transports
    drop these, so neither a caller's `Expect` nor its `Proxy-Authorization` ever reaches the wire."""
    return lowered in _HOP_BY_HOP or lowered.startswith("proxy-")


# What a transport raises when an exchange or a body read fails: this client's kinds below (each an OSError),
# its timeouts, and what the httpx transport raises in their place.
FAILURES: Final = (OSError, TimeoutError, ValueError)
# What a body's reader raises in place of one of those when its caller hands it this mapping: the gateway error
# that names the provider, the target and the cause.
Failed = Callable[[BaseException], BaseException]


class ConnectFailed(OSError):
    """The connection could not be opened; `cause` says why (`connect_cause`)."""

    def __init__(self, message: str, *, cause: str = "connect_failed") -> None:
        super().__init__(message)
        self.cause = cause


class Disconnected(ConnectionError):
    """The server closed or reset the connection before a response began."""

    def __init__(self, message: str, *, cause: str = "connection_closed") -> None:
        super().__init__(message)
        self.cause = cause


class Malformed(ConnectionError):
    """The response was cut short or was not valid HTTP/1.1."""

    def __init__(self, message: str, *, cause: str = "malformed_response") -> None:
        super().__init__(message)
        self.cause = cause


class Spent(Malformed):
    """A failed answer read again after its reader released it (the failure itself was raised already)."""

    def __init__(self) -> None:
        super().__init__("the response failed and was released")


def connect_cause(exc: BaseException) -> str:
    """Why opening a connection failed, for the operator (wire.errors.CAUSES), from the OS's error or the
    one it was raised from (httpx wraps them twice)."""
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            break
        if isinstance(seen, ssl.SSLCertVerificationError):
            return "tls_verification_failed"
        if isinstance(seen, ssl.SSLError):
            return "tls_error"
        if isinstance(seen, socket.gaierror):
            return "dns_failure"
        code = seen.errno if isinstance(seen, OSError) else None
        # asyncio joins the errors of every address it tried into one OSError without an errno.
        if code == errno.ECONNREFUSED or f"[Errno {errno.ECONNREFUSED}]" in str(seen):
            return "connection_refused"
        if code in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return "network_unreachable"
        seen = seen.__cause__ or seen.__context__
    return "connect_failed"


class TooLarge(Malformed):
    """The response went over one of the client's caps; the message names the cap, never upstream bytes."""


class _Stop(Exception):
    """Raised from a parser callback to stop llhttp at once; the reason was already recorded."""


# A timer firing this close to its wait's due time ends the wait: loops round a timer's delay (uvloop to
# the millisecond), so one armed for exactly that time may fire a hair before it by the loop's clock.
_EARLY_S: Final = 0.001


class Watchdog:
    """The timeouts of one connection's waits (for the head, for each read of the body), one at a time.

    One timer per connection, not one per wait: a wait only records its future and when it is due (loop
    time); the timer is armed only when none is or the armed one would fire too late, and at each firing
    it fails the current wait if its time is up, or arms itself again for it. On a busy keep-alive
    connection it fires about once per timeout instead of being armed and cancelled on every request.

    A wait whose time is up is failed only after the loop has read its sockets once more (`Grace`, which
    holds the timer's place meanwhile): an answer that came in time is not taken for an upstream timing out.
    """

    __slots__ = ("loop", "_waiting", "_due", "_cause", "_timer", "_timer_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._waiting: asyncio.Future[None] | None = None
        self._due = 0.0
        self._cause = ""
        self._timer: asyncio.Handle | Grace | None = None
        self._timer_at = 0.0

    def watch(self, fut: asyncio.Future[None], delay: float, cause: str) -> None:
        """Fail `fut` with `TimeoutError(cause)` if it is not done in `delay` seconds (the wait before, if
        any, is over)."""
        loop = self.loop
        self._waiting = fut
        due = self._due = loop.time() + delay
        self._cause = cause
        timer = self._timer
        if timer is None or due < self._timer_at:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_later(delay, self._fire)
            self._timer_at = due

    def idle(self) -> None:
        """The connection is gone: the timer goes unless a wait is still pending (an answer another task
        gave up on), which it still ends."""
        waiting, timer = self._waiting, self._timer
        if timer is not None and (waiting is None or waiting.done()):
            timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        fut = self._waiting
        if fut is None or fut.done():
            self._waiting = None
            return
        due = self._due
        if due - self.loop.time() > _EARLY_S:
            # A later wait than the one the timer was armed for: its own time is not up yet.
            self._timer = self.loop.call_at(due, self._fire)
            self._timer_at = due
            return
        self._timer = Grace(self.loop, self._expire, due)

    def _expire(self, due: float) -> None:
        fut = self._waiting
        if self._due != due or fut is None or fut.done():
            self._fire()  # answered in the grace; a later wait, if any, gets its timer (or grace) now
            return
        self._timer = None
        self._waiting = None
        fut.set_exception(TimeoutError(self._cause))  # the timeout that passed (wire.errors.CAUSES)


class Origin:
    """Scheme, host and port of a base URL, with the request-line prefix parts it implies."""

    __slots__ = ("host", "port", "tls", "host_header")

    def __init__(self, scheme: str, host: str, port: int | None) -> None:
        self.tls = scheme == "https"
        self.host = host
        default = 443 if self.tls else 80
        self.port = port or default
        shown = f"[{host}]" if ":" in host else host
        self.host_header = shown if self.port == default else f"{shown}:{self.port}"


def split(url: str) -> tuple[tuple[str, str, int | None], str]:
    """(origin key, path with query) of an absolute http(s) URL, the path sent exactly as given."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConnectFailed(f"not an http(s) URL: {url!r}")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return (parts.scheme, parts.hostname, parts.port), target


# What `request_line` and `header_lines` made, by what they were made from: a provider's URL and its headers
# repeat on nearly every request, and parsing the URL (urllib) and checking each header line again cost more
# than a dict probe. Emptied when full, so per-request values (a trace id) cannot grow them; a URL or header
# that fails its checks is never stored, so it fails every time. Only short ones are kept: a client's
# `inference_extra_headers` (or a long model name in a URL) are its own text, and 1,024 of a megabyte each
# would be a gigabyte held for nobody; the bound keeps both tables under about 5 MB.
_LINES: Final[dict[tuple[str, str], tuple[tuple[str, str, int | None], str]]] = {}
_HEADERS: Final[dict[tuple[tuple[str, str], ...], str]] = {}
_LINES_MAX: Final = 1024
_KEPT_MAX_CHARS: Final = 2048


def request_line(method: str, url: str) -> tuple[tuple[str, str, int | None], str]:
    """(origin key, `METHOD target HTTP/1.1` and its line end) of a request to an absolute http(s) URL."""
    found = _LINES.get((method, url))
    if found is not None:
        return found
    key, target = split(url)
    if not target.isprintable() or " " in target or not target.isascii():
        raise ValueError("the request target contains spaces, control or non-ASCII characters")
    found = key, f"{method} {target} HTTP/1.1\r\n"
    if len(url) <= _KEPT_MAX_CHARS:
        if len(_LINES) >= _LINES_MAX:
            _LINES.clear()
        _LINES[(method, url)] = found
    return found


def header_lines(headers: Mapping[str, str]) -> str:
    """The caller's header lines as sent, the blank line that ends the head included: the connection's own
    (`hop_by_hop`) dropped, and `accept-encoding: gzip, deflate` added unless the caller named an encoding."""
    items = tuple(headers.items())
    found = _HEADERS.get(items)
    if found is not None:
        return found
    lines: list[str] = []
    compression = True
    for name, value in items:
        lowered = name.lower()
        # `hop_by_hop` inlined: a call per header was a measurable share of this loop.
        if lowered in _HOP_BY_HOP or lowered.startswith("proxy-"):
            # This client owns framing and the connection: `Expect: 100-continue`, `Connection`, an
            # `Upgrade` or a second `Content-Length` from a caller could desync the pool.
            continue
        if lowered == "accept-encoding":
            compression = False
        line = f"{name}: {value}"
        # A line break or NUL would split the head: a smuggled header or a second request. `in` is a
        # memchr; counting the CRLFs of the whole head instead cost more than these checks.
        if "\n" in line or "\r" in line or "\0" in line:
            raise ValueError(f"header {name!r} contains a line break or NUL")
        lines.append(line + "\r\n")
    if compression:
        # Hosted APIs compress large answers when asked (the recorded OpenAI body was gzip); the saving
        # on the wire outweighs the decoding here.
        lines.append("accept-encoding: gzip, deflate\r\n")
    lines.append("\r\n")
    found = "".join(lines)
    if len(found) <= _KEPT_MAX_CHARS:
        if len(_HEADERS) >= _LINES_MAX:
            _HEADERS.clear()
        _HEADERS[items] = found
    return found


def _body_too_large(cap: int) -> TooLarge:
    return TooLarge(f"the response body is larger than the cap of {cap} bytes (caps.upstream_body_bytes)")


def _head_too_large(cap: int) -> TooLarge:
    return TooLarge(f"the response headers are larger than the cap of {cap} bytes (caps.upstream_header_bytes)")


def _too_many_interim(cap: int) -> TooLarge:
    return TooLarge(f"the response has more than {cap} interim (1xx) answers (caps.upstream_interim_answers)")
