"""gateway.server's HTTP/1.1 protocol: how an app hears that its client left, over raw sockets under a real uvicorn."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gateway.server import DISCONNECT
from tests.helpers.rawhttp import Client, answer, get, read_body, serve, wait_for


def test_a_client_that_leaves_mid_stream_is_seen_as_http_disconnect() -> None:
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await read_body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"tick", "more_body": True})
        seen.append((await receive())["type"])  # waits: the body is all read

    with serve(app) as server:
        client = Client(server.config.port)
        client.send(get())
        client.head()
        client.close()
        wait_for(lambda: seen == ["http.disconnect"], within=2)


def test_the_watcher_of_an_answered_request_hears_disconnect_at_once() -> None:
    """A task waiting on `receive` after the body ends is let go when the answer is out, not at close."""
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await read_body(receive)

        async def watch() -> None:
            seen.append((await receive())["type"])

        task = asyncio.get_running_loop().create_task(watch())
        await answer(send, b"ok")
        await task

    with serve(app) as server:
        client = Client(server.config.port)
        client.send(get())
        assert client.response().body == b"ok"
        wait_for(lambda: seen == ["http.disconnect"], within=2)
        client.send(get())
        assert client.response().body == b"ok"


def test_the_disconnect_extension_calls_back_once_when_the_client_leaves_mid_answer() -> None:
    """`gateway.disconnect`: the app learns of the client leaving without a task waiting in `receive`."""
    calls: list[str] = []
    done = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await read_body(receive)
        scope["extensions"][DISCONNECT](lambda: calls.append("gone"))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"tick", "more_body": True})
        while not calls:
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"", "more_body": False})  # goes nowhere
        done.set()

    with serve(app) as server:
        client = Client(server.config.port)
        client.send(get())
        client.head()
        client.close()
        wait_for(lambda: done.is_set(), within=2)
        time.sleep(0.05)
        assert calls == ["gone"]


def test_the_disconnect_extension_is_quiet_after_the_answer_and_late_subscribers_hear_at_once() -> None:
    calls: list[str] = []

    async def answered(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await read_body(receive)
        scope["extensions"][DISCONNECT](lambda: calls.append(scope["path"]))
        await answer(send, b"ok")

    with serve(answered) as server:
        client = Client(server.config.port)
        client.send(get("/answered"))
        assert client.response().body == b"ok"
        client.close()  # after the answer: not a disconnect of that request
        time.sleep(0.2)
        assert calls == []

    async def late(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await read_body(receive)
        while (await receive())["type"] != "http.disconnect":
            pass
        scope["extensions"][DISCONNECT](lambda: calls.append(scope["path"]))

    with serve(late) as server:
        client = Client(server.config.port)
        client.send(get("/late"))
        time.sleep(0.1)
        client.close()
        wait_for(lambda: calls == ["/late"], within=2)
