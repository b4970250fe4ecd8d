"""ASGI apps served by a real uvicorn with gateway.server's protocol, and a raw-socket client.

The client speaks HTTP/1.1 by hand (`Client.send` writes bytes as given; `Client.response` reads one
answer), so tests can pipeline, send malformed heads and see exactly what the server wrote.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from gateway.server import H1Protocol
from tests.helpers.servers import UvicornThread


@contextlib.contextmanager
def serve(app: Any, http: Any = H1Protocol, **options: Any) -> Iterator[uvicorn.Server]:
    """`app` served by uvicorn (uvloop) on a loopback port in a thread; `server.config.port` is the port.

    uvicorn leaves logging alone (`log_config=None`): its records reach pytest's `caplog`."""
    running = UvicornThread(app, http=http, lifespan="off", log_config=None, **options)
    with running:
        try:
            yield running.server
        finally:
            while _OPEN:
                _OPEN.pop().close()


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    chunks: list[bytes] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)


# Clients not closed yet: `serve` closes them as its server stops.
_OPEN: list[Client] = []


class Client:
    """One connection, read with a buffer of its own so pipelined answers are split where they end."""

    def __init__(self, port: int, timeout: float = 5) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        _OPEN.append(self)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed by the server")
        self.buf += data

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            self._fill()
        out, _, self.buf = self.buf.partition(marker)
        return out

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def head(self) -> tuple[int, list[tuple[str, str]]]:
        lines = self._until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = [(k.lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:])]
        return status, headers

    def response(self, method: str = "GET") -> Response:
        status, headers = self.head()
        answer = Response(status, headers, b"")
        length = answer.header("content-length")
        if method == "HEAD" or status in (204, 304):
            return answer
        if answer.header("transfer-encoding") == "chunked":
            while size := int(self._until(b"\r\n"), 16):
                answer.chunks.append(self._exactly(size))
                assert self._exactly(2) == b"\r\n"
            assert self._exactly(2) == b"\r\n"
            answer.body = b"".join(answer.chunks)
        elif length is not None:
            answer.body = self._exactly(int(length))
        else:  # to the close
            with contextlib.suppress(ConnectionError):
                while True:
                    self._fill()
            answer.body, self.buf = self.buf, b""
        return answer

    def closed(self, within: float = 3) -> bool:
        """The server closed the connection (EOF or reset) within `within` seconds, nothing more sent."""
        self.sock.settimeout(within)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def get(path: str = "/", extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: t\r\n{extra}\r\n".encode()


def post(path: str, body: bytes, extra: str = "") -> bytes:
    """A JSON POST with its content-length; `extra` is more header lines, each ending in CRLF."""
    head = f"POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + extra.encode() + b"\r\n" + body


async def read_body(receive: Any) -> bytes:
    body: bytes = b""
    while True:
        message = await receive()
        assert message["type"] == "http.request", message
        body += bytes(message.get("body", b""))
        if not message.get("more_body"):
            return body


async def answer(send: Any, body: bytes, status: int = 200, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    head = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def echo(scope: Any, receive: Any, send: Any) -> None:
    """Answers with what it saw: method, path, query, body, and the client's port."""
    body = await read_body(receive)
    text = f"{scope['method']} {scope['path']} {scope['query_string'].decode()} {scope['client'][1]} "
    await answer(send, text.encode() + body)


class _Wrapped:
    """A transport whose `write` is counted (uvloop's transports do not take new attributes)."""

    def __init__(self, transport: Any, writes: list[bytes]) -> None:
        self._transport = transport
        self._writes = writes

    def write(self, data: bytes) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def counting(base: type[Any]) -> tuple[type[Any], list[bytes]]:
    writes: list[bytes] = []

    class Counted(base):  # type: ignore[misc]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(_Wrapped(transport, writes))

    return Counted, writes


def wait_for(predicate: Any, within: float = 5) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
