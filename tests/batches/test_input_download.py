"""An input file's content is sent a stored chunk at a time: downloading a 100 MiB upload must not cost the
gateway its whole size (twice over, while joined) for as long as the client takes to read it, or a few
concurrent downloads of one key's file would hold gigabytes."""

from __future__ import annotations

import hashlib
import tracemalloc
from pathlib import Path

import httpx

from .conftest import EVAL_KEY, jsonl, line, served, upload

MIB = 1024 * 1024


def test_an_input_files_content_is_streamed_not_held_whole(tmp_path: Path) -> None:
    one = jsonl([line("x", prompt="y" * 4000)])
    data = one * (12 * MIB // len(one) + 1)  # about 12 MiB: 13 stored chunks
    with served(tmp_path, extra=", max_file_bytes: 67108864") as (gw, client):
        file_id = upload(client, data)
        tracemalloc.start()
        try:
            digest = hashlib.sha256()
            size = 0
            with httpx.stream(
                "GET", f"{gw.url}/v1/files/{file_id}/content", headers={"authorization": f"Bearer {EVAL_KEY}"}
            ) as resp:
                assert resp.status_code == 200
                # Its length is declared: a download cut short (the file deleted meanwhile) is seen as one.
                assert resp.headers.get("content-length") == str(len(data)), resp.headers
                for part in resp.iter_bytes():
                    digest.update(part)
                    size += len(part)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert size == len(data) and digest.digest() == hashlib.sha256(data).digest()
    # A few stored chunks (1 MiB each) in flight at most, not the file.
    assert peak < 6 * MIB, f"peak {peak / MIB:.1f} MiB while sending a {len(data) / MIB:.1f} MiB file"
