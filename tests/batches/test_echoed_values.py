"""A refused file's errors name its lines' values (a repeated `custom_id`, a wrong `url`) shortened: a line
may hold megabytes there, and the errors are kept on the batch and sent with every read and list of it."""

from __future__ import annotations

from pathlib import Path

import httpx

from .conftest import EVAL_KEY, jsonl, line, served, upload, wait_batch

MIB = 1024 * 1024


def test_a_failed_files_errors_do_not_repeat_its_huge_values(tmp_path: Path) -> None:
    huge = "u" * MIB
    lines = [{**line(f"url-{i}"), "url": huge} for i in range(4)]
    lines += [line("c" * MIB), line("c" * MIB)]  # the second repeats the first's custom_id
    with served(tmp_path, extra=", max_file_bytes: 67108864") as (gw, client):
        made = client.batches.create(
            input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
        )
        batch = wait_batch(client, made.id)
        listed = httpx.get(f"{gw.url}/v1/batches", headers={"authorization": f"Bearer {EVAL_KEY}"})
    assert batch.status == "failed" and batch.errors is not None
    assert [(e.code, e.line) for e in batch.errors.data] == [("invalid_url", n) for n in range(1, 5)] + [
        ("duplicate_custom_id", 6)
    ]
    for error in batch.errors.data:
        assert len(error.message) < 300, error.message[:200]
        assert "..." in error.message  # says it is shortened
    assert len(listed.content) < 16 * 1024
