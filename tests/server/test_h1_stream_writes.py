"""A stream's pieces on the wire: the first of a loop turn at once, the rest of that turn in one write.

Served by a real uvicorn with gateway.server's protocol, each transport write counted, read over a raw socket.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from gateway.server import H1Protocol
from gateway.server.cycle import ONE_WRITE_MAX
from tests.helpers.rawhttp import Client, Response, counting, get, serve, wait_for

START = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}


def piece(body: bytes) -> dict[str, Any]:
    return {"type": "http.response.body", "body": body, "more_body": True}


def events(n: int) -> list[bytes]:
    return [b'data: {"i": %d}\n\n' % i for i in range(n)]


END = {"type": "http.response.body", "body": b"", "more_body": False}


def streaming(parts: list[bytes], between: Any = None) -> Any:
    """An app streaming `parts`, one body message each, awaiting `between()` after each when given."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send(START)
        for part in parts:
            await send(piece(part))
            if between is not None:
                await between()
        await send(END)

    return app


def fetched(app: Any, protocol: Any, writes: list[bytes]) -> tuple[Response, list[bytes]]:
    """`app`'s answer to one GET, and every write its connection made, the stream's end included."""
    with serve(app, http=protocol) as server:
        client = Client(server.config.port)
        client.send(get())
        response = client.response()
        wait_for(lambda: bool(writes) and writes[-1].endswith(b"0\r\n\r\n"))
    return response, writes


def test_a_burst_sent_in_one_turn_leaves_in_two_writes_and_arrives_whole() -> None:
    """What the relay does with the events of one upstream read: the first leaves with the head, the other
    49 and the stream's end in one write at the turn's end, not one write each."""
    sent = events(50)
    response, writes = fetched(streaming(sent), *counting(H1Protocol))
    assert response.chunks == sent
    assert response.header("transfer-encoding") == "chunked"
    assert len(writes) == 2
    assert writes[0].startswith(b"HTTP/1.1 200 OK")
    assert writes[0].endswith(b"%x\r\n%s\r\n" % (len(sent[0]), sent[0]))


def test_pieces_sent_in_turns_of_their_own_each_leave_at_once() -> None:
    """Events that arrive one per read (an upstream pacing its tokens) are held for nothing: each one's write
    happens in the turn that sent it, before the app goes on."""
    sent = events(5)
    seen: list[int] = []
    protocol, writes = counting(H1Protocol)

    async def next_turn() -> None:
        await asyncio.sleep(0)
        seen.append(len(writes))

    response, _ = fetched(streaming(sent, next_turn), protocol, writes)
    assert response.chunks == sent
    assert seen == [1, 2, 3, 4, 5]  # each piece was on the wire by the next turn
    assert len(writes) == len(sent) + 1
    assert writes[-1] == b"0\r\n\r\n"


def test_a_long_burst_leaves_in_writes_of_about_the_cap() -> None:
    big = [bytes([65 + i]) * 40_000 for i in range(4)]
    response, writes = fetched(streaming(big), *counting(H1Protocol))
    assert response.chunks == big
    # The first at once; the second and third together once past the cap; the fourth with the end.
    assert len(writes) == 3
    assert all(len(w) <= 2 * ONE_WRITE_MAX for w in writes)


def test_an_app_failing_mid_burst_still_sends_what_it_sent_before_the_close(caplog: pytest.LogCaptureFixture) -> None:
    sent = events(3)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send(START)
        for event in sent:
            await send(piece(event))
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR, "uvicorn.error"), serve(app) as server:
        client = Client(server.config.port)
        client.send(get())
        status, _ = client.head()
        assert status == 200
        client.sock.settimeout(3)
        while data := client.sock.recv(65536):  # to the close
            client.buf += data
        framed = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in sent)
        assert client.buf == framed  # every piece, then the close: no end chunk, no traceback
    assert "Exception in ASGI application" in caplog.text
