"""gateway.server's HTTP/1.1 protocol: how a connection ends (shutdown, timeouts, close, HTTP/1.0, upgrades)
and slow peers, over raw sockets under a real uvicorn."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any

import pytest

from gateway.server import H1Protocol
from tests.helpers.rawhttp import Client, answer, echo, get, serve, wait_for


def test_shutdown_closes_idle_connections_at_once_and_lets_one_in_flight_finish() -> None:
    started = threading.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/slow":
            started.set()
            await asyncio.sleep(0.5)
        await answer(send, scope["path"].encode())

    with serve(app, timeout_keep_alive=30) as server:
        idle = Client(server.config.port)
        idle.send(get("/quick"))
        assert idle.response().body == b"/quick"
        busy = Client(server.config.port)
        busy.send(get("/slow"))
        assert started.wait(3)
        began = time.monotonic()
        server.should_exit = True
        assert idle.closed(within=1)
        assert time.monotonic() - began < 0.5  # before the request in flight is done
        response = busy.response()
        assert response.body == b"/slow"
        assert response.header("connection") == "close"
        assert busy.closed()


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout() -> None:
    with serve(echo, timeout_keep_alive=1) as server:
        client = Client(server.config.port)
        client.send(get())
        client.response()
        began = time.monotonic()
        assert client.closed(within=3)
        assert 0.9 < time.monotonic() - began < 2.5
        silent = Client(server.config.port)  # a connection that never sends anything is closed too
        assert silent.closed(within=3)


def test_a_request_sent_in_time_is_answered_though_the_loop_was_busy_past_the_keep_alive_timeout() -> None:
    """The loop held busy (an overloaded worker) past a keep-alive deadline finds the timer due before it reads
    the socket: a request that came in time is read and answered, not taken for an idle connection."""
    blocked = threading.Event()

    def hold(reader: socket.socket) -> None:
        asyncio.get_running_loop().remove_reader(reader)
        blocked.set()
        time.sleep(2.0)  # holds the whole event loop, in its read of the sockets, as a saturated worker does

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/block":
            # Held from a socket's callback: after it, uvloop runs the timers due before it reads again.
            reader, writer = socket.socketpair()
            asyncio.get_running_loop().add_reader(reader, hold, reader)
            writer.send(b"x")
            await asyncio.sleep(0.1)
            reader.close()
            writer.close()
        await answer(send, scope["path"].encode())

    with serve(app, timeout_keep_alive=1) as server:
        waiting = Client(server.config.port)
        waiting.send(get("/first"))
        assert waiting.response().body == b"/first"  # idle from here: its keep-alive deadline is 1 s away
        busy = Client(server.config.port)
        busy.send(get("/block"))
        assert blocked.wait(3)
        time.sleep(0.3)
        waiting.send(get("/in-time"))  # well within its deadline, while the loop cannot read it
        assert busy.response().body == b"/block"
        assert waiting.response().body == b"/in-time"


def test_a_head_that_never_ends_is_cut_at_the_head_timeout() -> None:
    class Quick(H1Protocol):
        head_timeout_s = 1.5

    with serve(echo, http=Quick, timeout_keep_alive=1) as server:
        client = Client(server.config.port)
        began = time.monotonic()
        for piece in (b"GET / HTTP/1.1\r\n", b"x", b"y"):  # a piece at a time, each within the keep-alive timeout
            client.send(piece)
            time.sleep(0.5)
        assert client.closed(within=3)
        assert 1.4 < time.monotonic() - began < 3


def test_http_1_0_gets_its_answer_and_a_close() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["http_version"] == "1.0"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"to the ", "more_body": True})
        await send({"type": "http.response.body", "body": b"end"})

    with serve(app) as server:
        client = Client(server.config.port)
        client.send(b"GET / HTTP/1.0\r\n\r\n")
        response = client.response()
        assert response.header("transfer-encoding") is None
        assert response.header("connection") == "close"
        assert response.body == b"to the end"


def test_connection_close_from_the_client_closes_after_the_answer() -> None:
    with serve(echo) as server:
        client = Client(server.config.port)
        client.send(get(extra="connection: close\r\n"))
        assert client.response().header("connection") == "close"
        assert client.closed()


def test_an_upgrade_request_is_answered_as_plain_http_and_closes(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "uvicorn.error"), serve(echo) as server:
        client = Client(server.config.port)
        client.send(get("/ws", "connection: upgrade\r\nupgrade: websocket\r\n") + get("/after"))
        response = client.response()
        assert response.status == 200 and response.body.startswith(b"GET /ws")
        assert client.closed()
    assert "Unsupported upgrade request." in caplog.text


def test_a_client_that_does_not_read_holds_the_app_at_send() -> None:
    """Write flow control: `send` waits while the transport's buffer is full, and goes on as it drains."""
    sent = 0
    piece = b"x" * 65536

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal sent
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(400):  # 25 MiB, far more than the socket buffers hold
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            sent += len(piece)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    with serve(app) as server:
        client = Client(server.config.port, timeout=10)
        client.send(get())
        time.sleep(0.5)
        held = sent
        assert held < 16 * 1024 * 1024
        time.sleep(0.2)
        assert sent == held  # stalled, not merely slow
        response = client.response()
        assert len(response.body) == 400 * 65536 and sent == 400 * 65536


def test_a_large_request_body_read_slowly_arrives_whole() -> None:
    """Read flow control: reading pauses while the app has a body piece unread, and resumes as it reads."""
    pieces: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            pieces.append(len(message["body"]))
            await asyncio.sleep(0.001)
            if not message["more_body"]:
                break
        await answer(send, str(sum(pieces)).encode())

    body = bytes(range(256)) * 32768  # 8 MiB
    with serve(app) as server:
        client = Client(server.config.port, timeout=20)
        client.send(f"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
        assert client.response().body == str(len(body)).encode()
        # Paused at the high-water mark: no piece handed over is much larger than one read past it.
        assert max(pieces) < 1024 * 1024


def test_answered_requests_are_counted_for_uvicorns_limit_max_requests() -> None:
    with serve(echo, limit_max_requests=2) as server:
        client = Client(server.config.port)
        client.send(get() + get())
        client.response(), client.response()
        wait_for(lambda: server.should_exit or server.server_state.total_requests >= 2)
        assert server.server_state.total_requests == 2
        assert client.closed(within=3)  # the server stopped after its second answer
