"""An upload is stored as it arrives: the gateway holds a bounded part of it, whatever the file's size."""

from __future__ import annotations

import json
import socket
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import httpx

from tests.helpers.sqlite import opened
from tests.helpers.waiting import wait_until

from .conftest import EVAL_KEY, line, served, wait_batch

_MIB: Final = 1024 * 1024
_SIZE: Final = 24 * _MIB  # the file uploaded: large against the bound asserted, small enough for a loaded machine
# What the whole process (gateway and client) may allocate at its peak per upload arriving: a few of the 1 MiB
# pieces it is stored in. Held whole, a file took twice its size.
_BOUND: Final = 5 * _MIB
_HEAD: Final = b'--x\r\ncontent-disposition: form-data; name="purpose"\r\n\r\nbatch\r\n' + (
    b'--x\r\ncontent-disposition: form-data; name="file"; filename="big.jsonl"\r\n'
    b"content-type: application/jsonl\r\n\r\n"
)
_TAIL: Final = b"\r\n--x--\r\n"


def _lines(size: int, bad_at: int | None = None) -> Iterator[bytes]:
    """JSONL lines of about 1 KiB, as many as `size` bytes hold, line `bad_at` not JSON."""
    sent, number = 0, 0
    while True:
        number += 1
        text = b"{not json\n" if number == bad_at else json.dumps(line(f"l{number}", prompt="p" * 900)).encode() + b"\n"
        if sent + len(text) > size:
            return
        sent += len(text)
        yield text


def _form(size: int, bad_at: int | None = None) -> Iterator[bytes]:
    """The multipart body, made as it is sent (the client holds none of it), in 64 KiB writes."""
    yield _HEAD
    buf = bytearray()
    for text in _lines(size, bad_at):
        buf += text
        if len(buf) >= 64 * 1024:
            yield bytes(buf)
            buf.clear()
    yield bytes(buf) + _TAIL


_AUTH: Final = {"authorization": f"Bearer {EVAL_KEY}"}


def _post(base: str, body: Iterator[bytes]) -> httpx.Response:
    headers = {**_AUTH, "content-type": "multipart/form-data; boundary=x"}
    return httpx.post(base + "/v1/files", headers=headers, content=body, timeout=120)


def test_an_upload_is_stored_as_it_arrives_in_bounded_memory(tmp_path: Path) -> None:
    with served(tmp_path, extra=f", max_file_bytes: {2 * _SIZE}") as (gw, client):
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            resp = _post(gw.url, _form(_SIZE))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert resp.status_code == 200, resp.text
        made = resp.json()
        sent = b"".join(_lines(_SIZE))
        assert made["bytes"] == len(sent) > _SIZE - 2048 and made["filename"] == "big.jsonl"
        assert peak < _BOUND, f"the upload of {_SIZE} bytes took {peak} bytes at its peak"
        # Stored whole, byte for byte.
        assert client.files.content(made["id"]).content == sent


def test_uploads_side_by_side_stay_bounded_and_a_bad_line_is_still_named(tmp_path: Path) -> None:
    size = 16 * _MIB
    with served(tmp_path, extra=f", max_file_bytes: {2 * _SIZE}") as (gw, client):
        answers: dict[int, httpx.Response] = {}
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()

            def send(n: int) -> None:
                answers[n] = _post(gw.url, _form(size, bad_at=n * 1000 + 7))

            posts = [threading.Thread(target=send, args=(n,)) for n in range(3)]
            for post in posts:
                post.start()
            for post in posts:
                post.join(timeout=120)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert len(answers) == 3 and all(a.status_code == 200 for a in answers.values()), answers
        assert peak < 3 * _BOUND, f"three uploads of {size} bytes took {peak} bytes at their peak"
        # The file is checked when a batch is made of it: the bad line fails the batch, named by its number.
        for n, answer in answers.items():
            made = client.batches.create(
                input_file_id=answer.json()["id"], endpoint="/v1/completions", completion_window="24h"
            )
            batch = wait_batch(client, made.id)
            assert batch.status == "failed"
            assert [(e.code, e.line) for e in batch.errors.data] == [("invalid_json_line", n * 1000 + 7)]


def test_an_upload_refused_part_way_leaves_nothing_stored(tmp_path: Path) -> None:
    with served(tmp_path, extra=f", max_file_bytes: {4 * _MIB}") as (gw, client):
        resp = _post(gw.url, _form(6 * _MIB))
        assert resp.status_code == 413 and resp.json()["error"]["code"] == "file_too_large", resp.text
        body = b"".join(_form(3 * _MIB)).replace(b'name="purpose"\r\n\r\nbatch', b'name="purpose"\r\n\r\nother')
        resp = _post(gw.url, iter([body]))
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "purpose", resp.text
        assert _stored(tmp_path) == (0, 0)
        # A client gone part-way: what had arrived was stored, and is deleted.
        head = (
            f"POST /v1/files HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {EVAL_KEY}\r\n"
            f"content-type: multipart/form-data; boundary=x\r\ncontent-length: {6 * _MIB}\r\n\r\n"
        ).encode()
        host, port = gw.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(head + b"".join(_form(3 * _MIB + 4096))[: -len(_TAIL)])
            wait_until(lambda: _stored(tmp_path) == (1, 3), timeout=30, interval=0.05)
            # Arriving: no route shows it.
            assert client.files.list().data == []
            with opened(tmp_path / "ledger.db") as db:
                partial = db.execute("SELECT id FROM batch_files").fetchone()[0]
            assert httpx.get(f"{gw.url}/v1/files/{partial}", headers=_AUTH, timeout=10).status_code == 404
        wait_until(lambda: _stored(tmp_path) == (0, 0), timeout=30, interval=0.05)
        assert client.files.list().data == []


def _stored(tmp_path: Path) -> tuple[int, int]:
    """The rows of files, and of their chunks, in the ledger's database."""
    with opened(tmp_path / "ledger.db") as db:
        files = db.execute("SELECT count(*) FROM batch_files").fetchone()[0]
        return files, db.execute("SELECT count(*) FROM batch_file_chunks").fetchone()[0]


def test_a_batch_of_a_large_file_is_checked_in_bounded_memory(tmp_path: Path) -> None:
    with served(tmp_path, extra=f", max_file_bytes: {2 * _SIZE}") as (gw, client):
        count = sum(1 for _ in _lines(_SIZE))
        resp = _post(gw.url, _form(_SIZE, bad_at=count))  # its last line is not JSON: every other is stored
        assert resp.status_code == 200, resp.text
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            made = client.batches.create(
                input_file_id=resp.json()["id"], endpoint="/v1/completions", completion_window="24h"
            )
            batch = wait_batch(client, made.id, timeout=120)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert batch.status == "failed"
        assert [(e.code, e.line) for e in batch.errors.data] == [("invalid_json_line", count)]
        assert peak < 3 * _BOUND, f"checking a file of {_SIZE} bytes took {peak} bytes at its peak"
    assert _stored(tmp_path)[0] == 1  # the upload; no line of the failed batch is left
    with opened(tmp_path / "ledger.db") as db:
        assert db.execute("SELECT count(*) FROM batch_lines").fetchone()[0] == 0


def test_uploads_still_arriving_count_toward_the_keys_bytes(tmp_path: Path) -> None:
    """`batches.max_key_bytes` holds while uploads arrive, not only as each finishes: a key sending many at once
    cannot fill the database past it first. The one that would pass it is refused as its chunks come."""
    resumed = threading.Event()
    first = b"".join(_form(2 * _MIB + 64 * 1024))
    cut = 2 * _MIB + 16 * 1024  # two whole chunks of the first upload stored, then it waits

    def paused() -> Iterator[bytes]:
        yield first[:cut]
        assert resumed.wait(60)
        yield first[cut:]

    answers: dict[str, httpx.Response] = {}
    with served(tmp_path, extra=f", max_key_bytes: {3 * _MIB}") as (gw, client):
        sending = threading.Thread(target=lambda: answers.update(first=_post(gw.url, paused())))
        sending.start()
        try:
            wait_until(lambda: _stored(tmp_path) == (1, 2), timeout=30, interval=0.05)
            second = _post(gw.url, _form(2 * _MIB))
        finally:
            resumed.set()
            sending.join(60)
        assert second.status_code == 409, second.text
        assert second.json()["error"]["code"] == "too_many_bytes" and "still arriving" in second.text
        assert answers["first"].status_code == 200, answers["first"].text
        assert [f.bytes for f in client.files.list().data] == [len(b"".join(_lines(2 * _MIB + 64 * 1024)))]
