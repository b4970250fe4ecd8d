"""The bytes one key keeps in uploads are capped (`batches.max_key_bytes`): `max_files` files of
`max_file_bytes` each would let one key fill the ledger's disk (1,000 of 100 MiB), which every tenant's
ledger and batches share. An upload past the cap is a 409 naming it; deleting files makes room again."""

from __future__ import annotations

import io
from pathlib import Path

import openai
import pytest

from .conftest import OTHER_KEY, jsonl, line, sdk, served, upload

CAP = 3000


def test_an_upload_past_the_keys_bytes_is_refused(tmp_path: Path) -> None:
    data = jsonl([line(f"k-{i}", prompt="x" * 200) for i in range(4)])
    assert CAP // 3 < len(data) < CAP // 2
    with served(tmp_path, extra=f", max_key_bytes: {CAP}") as (gw, client):
        first, second = upload(client, data), upload(client, data)
        with pytest.raises(openai.ConflictError) as refused:
            client.files.create(file=("third.jsonl", io.BytesIO(data)), purpose="batch")
        # Another key's uploads are its own.
        assert upload(sdk(gw.url, OTHER_KEY), data)
        client.files.delete(first)
        third = upload(client, data)
    body = refused.value.body
    assert isinstance(body, dict) and body["code"] == "too_many_bytes", body
    assert "batches.max_key_bytes" in body["message"] and body["param"] == "file"
    assert second != third
