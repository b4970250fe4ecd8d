"""Fuzzed upstream answers through both transports: whatever the bytes, no hang and no desync.

Hypothesis assembles answers from fragments that matter to HTTP/1.1 framing (status lines of every
version and kind, interim answers, Content-Length and Transfer-Encoding in every form the catalogue
knows, chunk lines, bodies, line ends LF / CR / CRLF, a second answer behind the first) and serves them
from the raw loopback server of `hostile.py`, sometimes closing afterwards, sometimes not. For each,
through h1 and through httpx: the request ends (an answer or a gateway error) within the deadline, and
the next requests on the same pool each read their own answer. The transports need not agree here:
random bytes hit the cases where RFC 9112 lets them differ; `test_transport_differential.py` pins
agreement case by case. Bounded (derandomized, a few dozen examples) so CI stays fast.
"""

from __future__ import annotations

import asyncio
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.upstream.client import Upstream
from gateway.upstream.transport import Timeouts
from wire.errors import GatewayError
from wire.upstream import UpstreamRequest

from .hostile import BY_NAME, Case, Close, HostileServer, Step, Wait
from .test_transport_differential import config

TIMEOUTS = Timeouts(connect=1.0, first_byte=0.4, total=0.8)
# The follow-ups get room to spare: on a loaded machine a slow honest answer is not what is under test.
GENEROUS = Timeouts(connect=2.0, first_byte=5.0, total=10.0)
FOLLOW_UPS = 2

STATUS = st.sampled_from(
    [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 204 No Content",
        b"HTTP/1.1 304 Not Modified",
        b"HTTP/1.1 100 Continue",
        b"HTTP/1.1 103 Early Hints",
        b"HTTP/1.1 101 Switching Protocols",
        b"HTTP/1.1 500 Oops",
        b"HTTP/1.0 200 OK",
        b"HTTP/1.1 2000 OK",
        b"HTTP/1.1 200",
        b"HTTP/9.9 200 OK",
        b"HTTP/1.1 abc",
    ]
)
HEADER = st.sampled_from(
    [
        b"content-length: 8",
        b"content-length: 0",
        b"content-length: 3",
        b"content-length: 100",
        b"content-length: -1",
        b"content-length: 8, 8",
        b"content-length: 99999999999999999999",
        b"transfer-encoding: chunked",
        b"transfer-encoding: gzip, chunked",
        b"transfer-encoding: identity",
        b"connection: close",
        b"connection: keep-alive",
        b"content-encoding: gzip",
        b"content-encoding: deflate",
        b"x-a: a\x00b",
        b"x-folded: a\r\n b",
        b"bad header",
        b"x-ok: 1",
    ]
)
EOL = st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n", b"\r"])
BODY = st.sampled_from(
    [
        b"",
        b'{"ok":1}',
        b"8\r\n" + b'{"ok":1}' + b"\r\n0\r\n\r\n",
        b"8;x=y\r\n" + b'{"ok":1}' + b"\r\n0\r\nx-t: 1\r\n\r\n",
        b"FFFFFFFFFFFFFFFFFFFFFF\r\n",
        b"zz\r\n",
        b"\x1f\x8b\x08\x00garbage",
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n" + b'{"n":666}\n',
    ]
)


@st.composite
def answers(draw: st.DrawFn) -> list[Step]:
    eol = draw(EOL)
    parts: list[bytes] = []
    for _ in range(draw(st.integers(1, 2))):  # sometimes an interim or a second answer first
        lines = [draw(STATUS), *draw(st.lists(HEADER, max_size=4))]
        parts.append(eol.join(lines) + eol + eol + draw(BODY))
    whole = b"".join(parts)
    steps: list[Step] = [whole]
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(whole)))
        steps = [whole[:cut], Wait(0.01), whole[cut:]]
    if draw(st.booleans()):
        steps.append(Close())
    return steps


async def _one(steps: list[Step]) -> None:
    server = HostileServer()
    await server.start()
    BY_NAME["fuzz"] = Case("fuzz", steps, None)
    try:
        for transport in ("h1", "httpx"):
            upstream = Upstream(parse_config(config(server.url), env={}))
            try:
                started = time.monotonic()
                ended = server.scripts_ended
                req = UpstreamRequest("POST", server.url + "/v1/completions", {"x-case": "fuzz"}, b"{}")
                try:
                    await upstream.send(transport, req, TIMEOUTS)
                except GatewayError:
                    pass  # any gateway error is an acceptable answer to garbage; a hang or a crash is not
                assert time.monotonic() - started < TIMEOUTS.total + 2.0, (transport, steps)  # bounded, not hung
                if any(not isinstance(step, bytes) for step in steps):
                    # Let what the script sends late (its second part, a close) arrive first: a client cannot tell
                    # bytes arriving after its next request was sent from that request's answer; not under test.
                    # Loopback: once the server has written them, a few turns of the loop hand them to the pool.
                    deadline = time.monotonic() + 5
                    while server.scripts_ended == ended and time.monotonic() < deadline:
                        await asyncio.sleep(0.005)
                    await asyncio.sleep(0.05)
                for i in range(FOLLOW_UPS):
                    own = UpstreamRequest("POST", server.url + "/v1/completions", {"x-req": str(i)}, b"{}")
                    resp = await upstream.send(transport, own, GENEROUS)
                    assert (resp.status, resp.body) == (200, b'{"n":%d}' % i), (transport, steps, resp.body)
            finally:
                await upstream.close()
    finally:
        BY_NAME.pop("fuzz", None)
        await server.stop()


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(answers())
def test_fuzzed_answers_never_hang_and_never_desync_either_pool(steps: list[Step]) -> None:
    asyncio.run(_one(steps))
