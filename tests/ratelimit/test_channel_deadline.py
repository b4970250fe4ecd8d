"""A script call whose reply does not come in time fails as Unanswered at its write's deadline, and the
connection is dropped (a late reply must never pair with a later call). One watchdog per connection keeps
every write's deadline: after replies that came, after a quiet spell, and behind a write still answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator

import hiredis
import pytest
import uvloop

from gateway.limits.scriptchannel import ScriptChannel, Unanswered, command
from gateway.state import SharedState
from tests.helpers.loops import run_on
from tests.helpers.redis import RedisServer

TIMEOUT_S = 0.1  # the URL's socket_timeout: a call's deadline is twice it


class Stub:
    """A Redis that answers `:1` to every command until told to stall, then reads and answers nothing."""

    def __init__(self) -> None:
        self.stalled = False
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        parser = hiredis.Reader()
        while data := await reader.read(65536):
            parser.feed(data)
            while parser.gets() is not False:
                if not self.stalled:
                    writer.write(b":1\r\n")
        writer.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


@pytest.fixture
async def channel() -> AsyncIterator[tuple[ScriptChannel, Stub]]:
    stub = Stub()
    stub.server = await asyncio.start_server(stub.handle, "127.0.0.1", 0)
    shared = SharedState(f"redis://127.0.0.1:{stub.port}/0?socket_timeout={TIMEOUT_S}")
    chan = ScriptChannel(shared, "return 1", "rl:")
    try:
        yield chan, stub
    finally:
        await chan.close()
        await shared.close()
        stub.server.close()


async def unanswered_after(chan: ScriptChannel) -> float:
    started = time.monotonic()
    with pytest.raises(Unanswered):
        await chan.call(command(b"PING"))
    return time.monotonic() - started


async def test_a_stalled_reply_fails_at_the_deadline_and_drops_the_connection(
    channel: tuple[ScriptChannel, Stub],
) -> None:
    chan, stub = channel
    assert await chan.call(command(b"PING")) == 1
    stub.stalled = True
    waited = await unanswered_after(chan)
    assert 2 * TIMEOUT_S * 0.9 <= waited < 2 * TIMEOUT_S + 0.5
    assert not chan.connected


async def test_the_deadline_holds_after_a_quiet_spell(channel: tuple[ScriptChannel, Stub]) -> None:
    """The watchdog found nothing due and stopped: the next write arms it again, at that write's deadline."""
    chan, stub = channel
    assert await chan.call(command(b"PING")) == 1
    await asyncio.sleep(3 * TIMEOUT_S)
    stub.stalled = True
    waited = await unanswered_after(chan)
    assert 2 * TIMEOUT_S * 0.9 <= waited < 2 * TIMEOUT_S + 0.5


async def test_a_write_behind_an_answered_one_keeps_its_own_deadline(channel: tuple[ScriptChannel, Stub]) -> None:
    """The watchdog armed for the first write finds it answered and waits for the next one's deadline."""
    chan, stub = channel
    assert await chan.call(command(b"PING")) == 1
    await asyncio.sleep(TIMEOUT_S)  # half the deadline: the watchdog armed by the first write is still due
    assert await chan.call(command(b"PING")) == 1
    stub.stalled = True
    waited = await unanswered_after(chan)
    assert 2 * TIMEOUT_S * 0.9 <= waited < 2 * TIMEOUT_S + 0.5


def test_a_reply_that_came_in_time_while_the_loop_was_busy_is_read_not_taken_for_a_stall(rds: RedisServer) -> None:
    """uvloop (the server's loop) runs its due timers before it polls its sockets again: a loop held busy in an
    I/O callback past a call's deadline must still read the reply waiting in the socket before it calls Redis
    stalled (and drops the connection, failing the call)."""

    async def main() -> tuple[object, bool]:
        loop = asyncio.get_running_loop()
        shared = SharedState(f"redis://127.0.0.1:{rds.port}/0?socket_timeout={TIMEOUT_S}")
        chan = ScriptChannel(shared, "return 1", "rl:")
        busy, poke = socket.socketpair()

        def other_work() -> None:  # another connection's, in its I/O callback, holding the loop past the deadline
            busy.recv(1)
            time.sleep(3 * 2 * TIMEOUT_S)

        loop.add_reader(busy, other_work)
        try:
            assert await chan.call(command(b"PING")) == b"PONG"  # connected
            reply = chan.call(command(b"PING"))
            loop.call_soon(poke.send, b"x")  # right after the call's write: the poll that follows runs it
            return await reply, chan.connected
        finally:
            loop.remove_reader(busy)
            busy.close()
            poke.close()
            await chan.close()
            await shared.close()

    assert run_on(uvloop.new_event_loop, main()) == (b"PONG", True)


def test_a_handshake_reply_that_came_in_time_while_the_loop_was_busy_is_taken() -> None:
    """Connecting (here: SELECT, for a database other than 0) is bounded by the call's deadline alone, with
    the same grace: a loop held past the socket timeout, while the reply to the handshake is already in the
    socket, still connects and answers the call."""
    listener = socket.create_server(("127.0.0.1", 0))
    busy, poke = socket.socketpair()

    def redis_stub() -> None:  # in a thread of its own: it answers while the client's loop is held
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError):
            parser = hiredis.Reader()
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                parser.feed(data)
                while (cmd := parser.gets()) is not False:
                    if cmd[0].upper() == b"SELECT":
                        time.sleep(0.02)  # the client is reading the reply, its read timer (if any) armed
                        poke.send(b"x")  # the client's next poll runs the hold
                        time.sleep(0.05)  # the hold has begun
                        conn.sendall(b"+OK\r\n")
                    else:
                        conn.sendall(b"+PONG\r\n")

    thread = threading.Thread(target=redis_stub, daemon=True)
    thread.start()

    async def main() -> tuple[object, bool]:
        loop = asyncio.get_running_loop()
        port = listener.getsockname()[1]
        shared = SharedState(f"redis://127.0.0.1:{port}/1?socket_timeout={TIMEOUT_S}")
        chan = ScriptChannel(shared, "return 1", "rl:")

        def other_work() -> None:  # another connection's: past the socket timeout, within the call's deadline
            busy.recv(1)
            time.sleep(1.5 * TIMEOUT_S)

        loop.add_reader(busy, other_work)
        try:
            return await chan.call(command(b"PING")), chan.connected
        finally:
            loop.remove_reader(busy)
            await chan.close()
            await shared.close()

    try:
        assert run_on(uvloop.new_event_loop, main()) == (b"PONG", True)
    finally:
        listener.close()
        busy.close()
        poke.close()
        thread.join(2)
