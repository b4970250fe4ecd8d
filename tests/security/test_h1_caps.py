"""gateway/upstream/h1.py holds at most its caps of what an upstream sends: bodies (after decoding), headers.

A hostile or broken upstream answers through a real loopback socket: a gzip bomb, an oversized body,
an oversized or endless header block. Each is refused with `h1.TooLarge` naming the cap, quickly, with
the bytes the client buffered bounded by the cap (measured with tracemalloc), and the next request on
the same client still gets its own answer.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from typing import Final

import pytest

from gateway.config import CapsConfig
from gateway.upstream import h1
from tests.security.test_h1_pool import RawServer, answer, call, read_request, well_behaved

MiB: Final = 1024 * 1024


def _compressed(total: int, wbits: int) -> bytes:
    """`total` zero bytes, compressed without ever holding them: a decompression bomb."""
    z = zlib.compressobj(9, zlib.DEFLATED, wbits)
    block = bytes(MiB)
    return b"".join(z.compress(block) for _ in range(total // MiB)) + z.flush()


GZIP_BOMB: Final = _compressed(200 * MiB, 16 + zlib.MAX_WBITS)  # about 200 KB on the wire
RAW_DEFLATE_BOMB: Final = _compressed(200 * MiB, -zlib.MAX_WBITS)


def bomb_server(bomb: bytes, encoding: bytes) -> RawServer:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            await read_request(reader)
            writer.write(answer(bomb, extra=b"content-encoding: " + encoding + b"\r\n"))
            await writer.drain()
            await asyncio.sleep(2)
            return
        await well_behaved(reader, writer)

    return RawServer(script)


@pytest.fixture
async def small() -> AsyncIterator[h1.Client]:
    c = h1.Client(4, max_body=4 * MiB, max_header_bytes=16 * 1024, max_headers=50)
    try:
        yield c
    finally:
        c.close()


def test_the_default_caps_are_the_configs() -> None:
    caps = CapsConfig()
    assert h1.MAX_BODY == caps.upstream_body_bytes == 64 * MiB
    assert h1.MAX_HEADER_BYTES == caps.upstream_header_bytes == 64 * 1024
    assert h1.MAX_HEADERS == 200
    assert h1.MAX_INTERIM == caps.upstream_interim_answers == 10


@pytest.mark.parametrize(("bomb", "encoding"), [(GZIP_BOMB, b"gzip"), (RAW_DEFLATE_BOMB, b"deflate")])
async def test_a_decompression_bomb_is_refused_at_the_cap_without_materialising(
    small: h1.Client, bomb: bytes, encoding: bytes
) -> None:
    assert len(bomb) < 300 * 1024
    async with bomb_server(bomb, encoding) as srv:
        tracemalloc.start()
        started = time.monotonic()
        try:
            with pytest.raises(h1.TooLarge, match=r"4194304 bytes \(caps.upstream_body_bytes\)"):
                await call(small, srv.url, b"first")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert time.monotonic() - started < 5
        assert peak < 16 * MiB, peak  # 200 MiB decoded before the fix
        assert await call(small, srv.url, b"second") == (200, b"answer to second")
        assert srv.connections == 2


async def test_a_relayed_bomb_expands_one_bounded_piece_at_a_time(small: h1.Client) -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            await read_request(reader)
            writer.write(answer(GZIP_BOMB, extra=b"content-encoding: gzip\r\n"))
            await writer.drain()
        # The reader lets the loop run between pieces, so the whole bomb may have arrived when it stops: the
        # connection, its answer read off the wire to the end, may then go back to the pool, and must answer
        # the next request in step.
        await well_behaved(reader, writer)

    async with RawServer(script) as srv:
        resp = await small.request("POST", srv.url, {}, b"x", connect_s=2, first_byte_s=2, total_s=5)
        tracemalloc.start()
        try:
            taken = biggest = 0
            async for chunk in resp.iter_chunks():
                biggest = max(biggest, len(chunk))
                taken += len(chunk)
                if taken >= 8 * MiB:
                    break
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            resp.release()
        assert biggest <= 64 * 1024  # one socket read of the bomb held 200 KB compressed, 200 MiB decoded
        assert peak < 8 * MiB, peak
        assert await call(small, srv.url, b"second") == (200, b"answer to second")


@pytest.mark.parametrize("stream", [False, True])
async def test_bytes_after_the_end_of_a_compressed_body_never_spin_the_reader(small: h1.Client, stream: bool) -> None:
    """Found by the fuzz suite: zlib leaves what follows the end of a gzip stream in `unconsumed_tail`,
    and a relayed read that handed it back for more decoding looped forever on the event loop."""
    body = zlib.compress(b"x" * 100_000, wbits=16 + zlib.MAX_WBITS) + b"trailing junk"

    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(body, extra=b"content-encoding: gzip\r\n"))
        await writer.drain()
        await asyncio.sleep(1)

    async with RawServer(script) as srv:
        resp = await small.request("POST", srv.url, {}, b"x", connect_s=2, first_byte_s=2, total_s=2)
        try:
            if stream:
                got = b"".join([chunk async for chunk in resp.iter_chunks()])
            else:
                got = await resp.read()
        finally:
            resp.release()
        assert got == b"x" * 100_000


@pytest.mark.parametrize("wbits", [zlib.MAX_WBITS, -zlib.MAX_WBITS], ids=["zlib-wrapped", "raw"])
@pytest.mark.parametrize("piece", [1, 7, 65536])
async def test_deflate_is_decoded_wrapped_or_raw(small: h1.Client, wbits: int, piece: int) -> None:
    payload = b'{"choices": [{"text": "deflated"}]}' * 50
    z = zlib.compressobj(6, zlib.DEFLATED, wbits)
    body = z.compress(payload) + z.flush()

    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-encoding: deflate\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(0, len(body), piece):
            part = body[i : i + piece]
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with RawServer(script) as srv:
        assert await call(small, srv.url, b"x") == (200, payload)


async def test_a_body_over_the_cap_by_its_content_length_is_refused_before_it_arrives(small: h1.Client) -> None:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (5 * MiB))
            await writer.drain()
            await asyncio.sleep(2)  # the body never comes: the refusal must not wait for it
            return
        await well_behaved(reader, writer)

    async with RawServer(script) as srv:
        started = time.monotonic()
        with pytest.raises(h1.TooLarge, match="caps.upstream_body_bytes"):
            await call(small, srv.url, b"first")
        assert time.monotonic() - started < 1
        assert await call(small, srv.url, b"second") == (200, b"answer to second")


async def test_an_endless_chunked_body_is_refused_at_the_cap(small: h1.Client) -> None:
    piece = b"y" * 65536

    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
        await well_behaved(reader, writer)

    async with RawServer(script) as srv:
        tracemalloc.start()
        try:
            with pytest.raises(h1.TooLarge, match="4194304 bytes"):
                await call(small, srv.url, b"first", total_s=10)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 16 * MiB, peak
        assert await call(small, srv.url, b"second") == (200, b"answer to second")


async def test_the_default_body_cap_holds_without_configuration() -> None:
    client = h1.Client(2)

    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (64 * MiB + 1))
        await writer.drain()
        await asyncio.sleep(2)

    try:
        async with RawServer(script) as srv:
            with pytest.raises(h1.TooLarge, match="67108864 bytes"):
                await call(client, srv.url, b"x")
    finally:
        client.close()


# -- the head --------------------------------------------------------------------------------------


def head_server(head: bytes, *, trickle: bool = False) -> RawServer:
    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            await read_request(reader)
            if trickle:
                writer.write(head)
                while True:  # one header value that never ends
                    writer.write(b"v" * 1024)
                    await writer.drain()
                    await asyncio.sleep(0.001)
            writer.write(head)
            await writer.drain()
            await asyncio.sleep(2)
            return
        await well_behaved(reader, writer)

    return RawServer(script)


@pytest.mark.parametrize(
    ("name", "head", "trickle", "cap"),
    [
        (
            "large-header-block",
            b"HTTP/1.1 200 OK\r\n" + b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 1000) for i in range(40)) + b"\r\n",
            False,
            "caps.upstream_header_bytes",
        ),
        ("too-many-headers", b"HTTP/1.1 200 OK\r\n" + b"x-h: 1\r\n" * 51 + b"\r\n", False, "50 header fields"),
        ("endless-header-value", b"HTTP/1.1 200 OK\r\nx-endless: ", True, "caps.upstream_header_bytes"),
        ("endless-reason-phrase", b"HTTP/1.1 200 ", True, "caps.upstream_header_bytes"),
        ("interim-flood", b"HTTP/1.1 100 Continue\r\n\r\n" * 1000, False, "10 interim .* answers"),
        (
            "large-trailers",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n"
            + b"".join(b"x-t%d: %s\r\n" % (i, b"v" * 1000) for i in range(40))
            + b"\r\n",
            False,
            "caps.upstream_header_bytes",
        ),
    ],
)
async def test_an_oversized_head_is_refused_at_the_cap(
    small: h1.Client, name: str, head: bytes, trickle: bool, cap: str
) -> None:
    async with head_server(head, trickle=trickle) as srv:
        started = time.monotonic()
        with pytest.raises(h1.TooLarge, match=cap) as caught:
            await call(small, srv.url, b"first", total_s=10)
        assert b"v" * 16 not in str(caught.value).encode()  # the message never carries upstream bytes
        assert time.monotonic() - started < 2  # refused at the cap, not by a timeout
        assert await call(small, srv.url, b"second") == (200, b"answer to second")


@pytest.mark.parametrize("interims", [0, 1, 10, 11])
async def test_interim_answers_are_skipped_up_to_their_cap(interims: int) -> None:
    head = b"HTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n" * interims

    async def script(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if n == 0:
            await read_request(reader)
            writer.write(head + answer(b"the answer"))
            await writer.drain()
        await well_behaved(reader, writer)

    client = h1.Client(4)
    try:
        async with RawServer(script) as srv:
            if interims <= h1.MAX_INTERIM:
                assert await call(client, srv.url, b"first") == (200, b"the answer")
            else:
                with pytest.raises(h1.TooLarge, match=r"more than 10 interim \(1xx\) answers"):
                    await call(client, srv.url, b"first")
            assert await call(client, srv.url, b"second") == (200, b"answer to second")
    finally:
        client.close()


async def test_interim_answers_under_a_raised_count_cap_still_meet_the_byte_cap() -> None:
    client = h1.Client(4, max_header_bytes=16 * 1024, max_interim=1_000_000)
    try:
        async with head_server(b"HTTP/1.1 100 Continue\r\n\r\n" * 1000) as srv:
            started = time.monotonic()
            with pytest.raises(h1.TooLarge, match="caps.upstream_header_bytes"):
                await call(client, srv.url, b"first", total_s=10)
            assert time.monotonic() - started < 2
            assert await call(client, srv.url, b"second") == (200, b"answer to second")
    finally:
        client.close()
