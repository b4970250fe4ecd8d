"""gateway.server's HTTP/1.1 protocol under a real uvicorn, spoken to over raw sockets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from typing import Any

import pytest

from gateway.server import H1Protocol
from gateway.server.h1 import MAX_HEAD_BYTES, MAX_PIPELINED
from tests.helpers.rawhttp import Client, answer, counting, echo, get, read_body, serve, wait_for


def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    with serve(echo) as server:
        client = Client(server.config.port)
        client.send(get("/one"))
        first = client.response()
        client.send(get("/two%20x?q=1"))
        second = client.response()
        port = client.sock.getsockname()[1]
        assert first.body == f"GET /one  {port} ".encode()
        assert second.body == f"GET /two x q=1 {port} ".encode()
        assert first.header("connection") is None
        assert first.header("date") is not None


def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    running = 0
    most = 0

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        # The first waits longest: answered in arrival order all the same.
        await asyncio.sleep({"/a": 0.1, "/b": 0.05, "/c": 0}[scope["path"]])
        await read_body(receive)
        running -= 1
        await answer(send, scope["path"].encode())

    with serve(app) as server:
        client = Client(server.config.port)
        client.send(get("/a") + b"POST /b HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\nhi" + get("/c"))
        assert [client.response().body for _ in range(3)] == [b"/a", b"/b", b"/c"]
        assert most == 1


def test_a_pipelined_flood_is_answered_up_to_the_cap_then_refused_and_closed() -> None:
    """Thousands of tiny requests in one write: 1 answered + 64 waiting, then a 503 and the close, not a
    cycle and a scope kept for each."""
    started = 0

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal started
        started += 1
        await read_body(receive)
        await asyncio.sleep(0.001)
        await answer(send, b"ok")

    with serve(app) as server:
        client = Client(server.config.port)
        client.send(get() * 2000)
        bodies = [client.response().body for _ in range(1 + MAX_PIPELINED)]
        assert bodies == [b"ok"] * (1 + MAX_PIPELINED)
        refused = client.response()
        assert refused.status == 503
        assert client.closed()
        assert started == 1 + MAX_PIPELINED


def test_chunked_request_body() -> None:
    with serve(echo) as server:
        client = Client(server.config.port)
        client.send(b"POST /up HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        time.sleep(0.05)
        client.send(b"6\r\n world\r\n0\r\n\r\n")
        assert client.response().body.endswith(b" hello world")


def test_expect_100_continue_is_answered_when_the_app_reads_the_body() -> None:
    with serve(echo) as server:
        client = Client(server.config.port)
        client.send(b"POST /e HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\n")
        assert client.head() == (100, [])
        client.send(b"data")
        assert client.response().body.endswith(b" data")


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nhost: t\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n",
        b"GET / HTTP/1.1\r\nhost: t\r\n" + b"".join(b"x-h%d: v\r\n" % i for i in range(101)) + b"\r\n",
    ],
    ids=["one-big-header", "too-many-headers"],
)
def test_an_oversized_head_is_431_and_closes(head: bytes) -> None:
    with serve(echo) as server:
        client = Client(server.config.port)
        client.send(head)
        response = client.response()
        assert response.status == 431
        assert response.header("connection") == "close"
        assert client.closed()


def test_a_head_sent_in_pieces_past_the_cap_is_431() -> None:
    with serve(echo) as server:
        client = Client(server.config.port)
        head = b"GET / HTTP/1.1\r\nhost: t\r\nx-big: "
        client.send(head)
        left = MAX_HEAD_BYTES - len(head)  # the cap reached, not passed: all of it is read
        while left:  # never ends its line: the parser holds it, the bytes are counted
            piece = min(left, 4096)
            client.send(b"a" * piece)
            left -= piece
        # One byte past the cap.
        client.send(b"a")
        assert client.response().status == 431


def _past_the_head_cap(client: Client) -> None:
    client.send(b"GET / HTTP/1.1\r\nhost: t\r\nx-big: " + b"a" * (MAX_HEAD_BYTES + 1))


def test_a_client_still_sending_after_a_refusal_gets_the_answer_not_a_reset() -> None:
    """The refusal leaves with a FIN and what follows is read and dropped: the client's sends all succeed,
    it reads its 431, and the server closes as soon as the client closes its side."""

    class Patient(H1Protocol):
        linger_s = 30.0

    with serve(echo, http=Patient) as server:
        client = Client(server.config.port)
        _past_the_head_cap(client)
        for _ in range(8):  # closed at once, the server's kernel would answer these with a reset
            time.sleep(0.02)
            client.send(b"a" * 65_536)
        assert client.response().status == 431
        began = time.monotonic()
        client.sock.shutdown(socket.SHUT_WR)
        wait_for(lambda: not server.server_state.connections, within=3)
        assert time.monotonic() - began < 2


def test_an_answer_that_closes_before_the_body_is_read_lets_the_client_finish_sending() -> None:
    async def refuse(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await answer(send, b"too large", status=413, headers=[(b"connection", b"close")])

    with serve(refuse) as server:
        client = Client(server.config.port)
        client.send(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 1000000\r\n\r\n" + b"x" * 65_536)
        for _ in range(7):
            time.sleep(0.02)
            client.send(b"x" * 65_536)
        response = client.response()
        assert (response.status, response.body) == (413, b"too large")
        assert client.closed()


def test_lingering_ends_after_its_time_or_its_bytes() -> None:
    class Brief(H1Protocol):
        linger_s = 0.5

    with serve(echo, http=Brief) as server:
        silent = Client(server.config.port)  # refused, then neither sends nor closes: closed at linger_s
        _past_the_head_cap(silent)
        assert silent.response().status == 431
        began = time.monotonic()
        wait_for(lambda: not server.server_state.connections, within=3)
        assert 0.3 < time.monotonic() - began < 2

    class Patient(H1Protocol):
        linger_s = 30.0
        linger_bytes = 200_000

    with serve(echo, http=Patient) as server:
        flood = Client(server.config.port)  # goes on sending: closed once past linger_bytes
        _past_the_head_cap(flood)
        with contextlib.suppress(OSError):
            for _ in range(20):
                flood.send(b"a" * 65_536)
        wait_for(lambda: not server.server_state.connections, within=5)


def test_a_malformed_request_is_400_and_closes() -> None:
    with serve(echo) as server:
        client = Client(server.config.port)
        client.send(b"GARBAGE\x00 / HTTP/1.1\r\n\r\n")
        response = client.response()
        assert response.status == 400
        assert response.body == b"Invalid HTTP request received."
        assert client.closed()


_CHUNKED = "POST /up HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param((_CHUNKED + "zz\r\nabc\r\n0\r\n\r\n").encode(), id="a bad chunk size"),
        pytest.param((_CHUNKED + "3\r\nabc\r\nqq\r\n").encode(), id="a bad chunk after good data"),
        pytest.param(b"POST /up HTTP/1.1\r\nhost: t\r\ntransfer-encoding: gzip\r\n\r\nabc", id="an unframed body"),
    ],
)
def test_a_malformed_body_is_400_and_its_app_is_told_the_client_left(request_bytes: bytes) -> None:
    """The head was good, so the app runs and waits on the body; the body's error answers the request."""
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (message := await receive())["type"] == "http.request" and message.get("more_body"):
            pass
        seen.append(message["type"])
        await answer(send, b"must not be sent")

    with serve(app) as server:
        client = Client(server.config.port)
        client.send(request_bytes)
        response = client.response()
        assert response.status == 400
        assert response.body == b"Invalid HTTP request received."
        assert client.closed()
        wait_for(lambda: seen == ["http.disconnect"] and not server.server_state.tasks)


def test_a_malformed_body_of_a_pipelined_request_is_refused_after_the_answers_before_it() -> None:
    started: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        started.append(scope["path"])
        await asyncio.sleep(0.1)
        await read_body(receive)
        await answer(send, scope["path"].encode())

    with serve(app) as server:
        client = Client(server.config.port)
        client.send(get("/first") + (_CHUNKED + "zz\r\n").encode())
        assert client.response().body == b"/first"
        assert client.response().status == 400
        assert client.closed()
        assert started == ["/first"]


def test_a_malformed_body_after_the_answer_began_closes_the_connection() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"transfer-encoding", b"chunked")]})
        await send({"type": "http.response.body", "body": b"early", "more_body": True})
        await read_body(receive)

    with serve(app) as server:
        client = Client(server.config.port)
        client.send(_CHUNKED.encode())
        assert client.head()[0] == 200
        client.send(b"zz\r\n")
        assert client.closed()
        wait_for(lambda: not server.server_state.tasks)


def test_head_and_204_carry_no_body() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/none":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
        else:
            await answer(send, b"twelve bytes")

    with serve(app) as server:
        client = Client(server.config.port)
        client.send(b"HEAD / HTTP/1.1\r\nhost: t\r\n\r\n" + get("/none") + get("/"))
        head = client.response("HEAD")
        assert head.header("content-length") == "12"
        nothing = client.response()
        assert nothing.status == 204
        assert nothing.header("transfer-encoding") is None
        assert client.response().body == b"twelve bytes"  # so nothing stray came before it


def test_a_stream_is_chunked_and_each_chunk_leaves_when_sent() -> None:
    go_on = threading.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        while not go_on.is_set():
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"second", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    with serve(app) as server:
        client = Client(server.config.port)
        client.send(get())
        status, headers = client.head()
        assert status == 200 and ("transfer-encoding", "chunked") in headers
        # The first chunk arrives while the app still holds the second back.
        client.sock.settimeout(3)
        while b"first\r\n" not in client.buf:
            client.buf += client.sock.recv(65536)
        assert client.buf == b"5\r\nfirst\r\n"
        go_on.set()
        client.send(get())  # the connection stays usable after the stream's last chunk
        client.buf = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + client.buf
        assert client.response().chunks == [b"first", b"second"]


@pytest.mark.parametrize(
    "header",
    [
        (b"x-evil", b"a\r\nset-cookie: pwned=1"),
        (b"x-evil", b"a\nset-cookie: pwned=1"),
        (b"x-evil", b"a\x00b"),
        (b"x-evil\r\nset-cookie", b"pwned=1"),
        (b"x evil", b"v"),
    ],
)
def test_a_header_that_would_split_the_answer_is_refused_with_500(
    header: tuple[bytes, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await answer(send, b"never", headers=[header])

    with caplog.at_level(logging.ERROR, "uvicorn.error"), serve(app) as server:
        client = Client(server.config.port)
        client.send(get())
        response = client.response()
        assert response.status == 500
        assert response.body == b"Internal Server Error"
        assert not any(name in ("set-cookie", "x-evil") for name, _ in response.headers)
        assert client.closed()
        assert client.buf == b""  # nothing after the 500: no second answer smuggled in
    assert "Exception in ASGI application" in caplog.text


def test_a_body_longer_than_its_content_length_is_a_500_while_nothing_went_out() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"too long"})

    with serve(app) as server:
        client = Client(server.config.port)
        client.send(get())
        response = client.response()
        assert (response.status, response.body) == (500, b"Internal Server Error")


def test_an_app_that_fails_after_its_stream_began_has_its_connection_closed(caplog: pytest.LogCaptureFixture) -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR, "uvicorn.error"), serve(app) as server:
        client = Client(server.config.port)
        client.send(get())
        with pytest.raises(ConnectionError):
            client.response()
        assert b"boom" not in client.buf and b"Traceback" not in client.buf
    assert "Exception in ASGI application" in caplog.text


@pytest.mark.parametrize(("http", "expected"), [("ours", 1), ("httptools", 2)])
def test_a_content_length_answer_leaves_in_one_write(http: str, expected: int) -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    protocol, writes = counting(H1Protocol if http == "ours" else HttpToolsProtocol)
    with serve(echo, http=protocol) as server:
        client = Client(server.config.port)
        client.send(get("/w"))
        response = client.response()
        assert response.body.startswith(b"GET /w")
        wait_for(lambda: writes)
        assert len(writes) == expected
        assert writes[-1].endswith(response.body)


async def unframed(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """One body message, no content-length (as the gateway's endpoints answer)."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"whole": true}', "more_body": False})


@pytest.mark.parametrize(("http", "expected"), [("ours", 1), ("httptools", 2)])
def test_a_whole_answer_without_content_length_is_given_one_and_leaves_in_one_write(http: str, expected: int) -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    protocol, writes = counting(H1Protocol if http == "ours" else HttpToolsProtocol)
    with serve(unframed, http=protocol) as server:
        client = Client(server.config.port)
        client.send(get() + get())
        first, second = client.response(), client.response()
        assert first.body == second.body == b'{"whole": true}'
        wait_for(lambda: len(writes) == 2 * expected)
        if http == "ours":
            assert first.header("content-length") == "15" and first.header("transfer-encoding") is None


def test_a_client_that_takes_no_bytes_is_cut_after_the_send_timeout() -> None:
    """A client that stops reading a stream must not hold its request (and what the request holds: a server's
    slot, a lease) for as long as it likes: past the send timeout the connection is aborted and the app told."""
    gone = threading.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope["extensions"]["gateway.disconnect"](gone.set)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        piece = b"x" * 65_536
        while not gone.is_set():
            await send({"type": "http.response.body", "body": piece, "more_body": True})

    class Impatient(H1Protocol):
        send_timeout_s = 0.5

    with serve(app, http=Impatient) as server:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.config.port))
        try:
            sock.sendall(get())  # then never reads
            began = time.monotonic()
            assert gone.wait(10)
            assert 0.4 < time.monotonic() - began < 8
            wait_for(lambda: not server.server_state.connections, within=5)
        finally:
            sock.close()
