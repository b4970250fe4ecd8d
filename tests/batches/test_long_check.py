"""An input file whose check takes longer than `batches.lease_ms`: the process checking it keeps its lease
all along, so another replica never takes the batch over to check it again. Two gateways share a real SQLite
file; the file is long enough (hundreds of thousands of lines) that parsing it outlasts the shortest lease.
Its last line names another endpoint, so the batch ends `failed` once checked and no line is sent."""

from __future__ import annotations

import time
from pathlib import Path

from tests.helpers.servers import GatewayChild, cli_env
from tests.helpers.sqlite import opened

from .conftest import ENV, EVAL_KEY, config, sdk, upload, wait_batch

# Checking the file (parsing it, storing its lines) takes about 6 s on a shared 2-core machine: six leases. The
# test asserts it outlasted two, so a machine fast enough to make it moot says so rather than passing.
LINES = 350_000
LEASE_MS = 1000


def _holder(db: Path, batch_id: str) -> tuple[str, str | None]:
    with opened(db, timeout=10) as conn:
        row = conn.execute("SELECT status, lease_owner FROM batches WHERE id = ?", (batch_id,)).fetchone()
    return str(row[0]), row[1]


def _file() -> bytes:
    good = b'{"custom_id":"c%d","method":"POST","url":"/v1/completions","body":{"model":"fast","prompt":"p"}}\n'
    last = b'{"custom_id":"last","method":"POST","url":"/v1/embeddings","body":{"model":"fast","input":"p"}}\n'
    return b"".join(good % i for i in range(LINES - 1)) + last


def test_a_file_checked_for_longer_than_the_lease_is_checked_by_one_replica(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    gateways = []
    for name in "ab":
        path = tmp_path / f"{name}.yaml"
        path.write_text(config(f"sqlite:///{db}", lease_ms=LEASE_MS, extra=f", max_lines: {LINES}"))
        gateways.append(GatewayChild(path, env=cli_env(**ENV)))
    try:
        for gw in gateways:
            gw.wait_ready()
        client = sdk(gateways[0].url, EVAL_KEY)
        file_id = upload(client, _file())
        began = time.monotonic()
        made = client.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")
        holders = set()
        deadline = time.monotonic() + 60
        while (now := _holder(db, made.id))[0] == "validating":
            if now[1] is not None:
                holders.add(now[1])
            assert len(holders) <= 1, f"taken over while its file was checked: {holders}"
            assert time.monotonic() < deadline, "the file was never checked"
            time.sleep(0.02)
        checked_for = time.monotonic() - began
        batch = wait_batch(client, made.id, timeout=10)
    finally:
        for gw in gateways:
            gw.stop()
    assert checked_for > 2 * LEASE_MS / 1000, f"checked in {checked_for:.1f} s: not past the lease, raise LINES"
    assert batch.status == "failed", batch.status
    assert batch.errors is not None and [(e.code, e.line) for e in batch.errors.data] == [("invalid_url", LINES)]
    logs = "".join(gw.log.read_text() for gw in gateways)
    assert "taken over" not in logs, logs
