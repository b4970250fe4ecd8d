"""Two gateways share a PostgreSQL ledger. The one running a batch is SIGKILLed mid-batch, and the other takes
the batch over: as containers of one host name (each PID 1 of its own PID namespace, which cannot see the
other's processes) once the dead one's lease has run out, `batches.lease_ms`; as processes of one host at once,
seeing the holder's pid is gone. Or the holder stalls (SIGSTOP) past its lease, the other takes over, and the
stalled one wakes (SIGCONT) to write nothing more. Every custom_id is answered exactly once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psycopg
import pytest

from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayChild, cli_env, unshare_pid_works

from .conftest import ENV, EVAL_KEY, config, jsonl, line, results, sdk, upload, wait_batch

CONCURRENCY = 4


def _runner(url: str, batch_id: str) -> tuple[str | None, int, float]:
    """The batch's lease holder, its lines answered, and when its lease runs out."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT lease_owner, completed, lease_until FROM batches WHERE id = %s", (batch_id,)
        ).fetchone()
    assert row is not None
    return row[0], int(row[1]), float(row[2])


def _sends(url: str, batch_id: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT sends FROM batch_lines WHERE batch_id = %s", (batch_id,))]


def _is(owner: str, gw: GatewayChild) -> bool:
    """Whether the lease holder `owner` (host:boot:pid namespace:pid:random) is the gateway `gw`."""
    _, _, namespace, pid, _ = owner.split(":")
    status = Path(f"/proc/{gw.server_pid}/status").read_text()
    in_namespace = next(x for x in status.splitlines() if x.startswith("NSpid:")).split()[-1]
    return namespace == str(os.stat(f"/proc/{gw.server_pid}/ns/pid").st_ino) and pid == in_namespace


def _two(tmp_path: Path, url: str, lease_ms: int, pid1: bool) -> tuple[GatewayChild, GatewayChild]:
    gateways = []
    for name in "ab":
        path = tmp_path / f"{name}.yaml"  # a config (and a log) each
        path.write_text(config(url, lease_ms=lease_ms, concurrency=CONCURRENCY))
        gateways.append(GatewayChild(path, pid1=pid1, env=cli_env(**ENV)))
    return gateways[0], gateways[1]


@pytest.mark.parametrize("containers", [True, False], ids=["containers-wait-for-the-lease", "processes-at-once"])
def test_a_replica_sigkilled_mid_batch_is_taken_over(tmp_path: Path, pg: PostgresServer, containers: bool) -> None:
    if containers and not unshare_pid_works():
        pytest.skip("needs `unshare --pid` (a PID namespace per gateway, as containers have)")
    lease_ms = 3000
    lines = [line(f"k-{i}", model="slow", prompt=f"prompt {i}") for i in range(200)]
    a, b = _two(tmp_path, pg.url, lease_ms, containers)
    try:
        a.wait_ready()
        b.wait_ready()
        client = sdk(a.url, EVAL_KEY)
        made = client.batches.create(
            input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
        )
        deadline = time.monotonic() + 60
        holders = set()
        while (now := _runner(pg.url, made.id))[1] < 40:
            assert time.monotonic() < deadline, now
            if now[0] is not None:
                holders.add(now[0])
            time.sleep(0.02)
        # Both were up all along: neither took the other's batch while it held it.
        owner = now[0]
        assert owner is not None and holders == {owner}
        dead, survivor = (a, b) if _is(owner, a) else (b, a)
        assert _is(owner, dead) and not _is(owner, survivor)
        os.kill(dead.server_pid, signal.SIGKILL)
        killed = time.time()
        dead.proc.wait(10)
        _, done_at_kill, lease_until = _runner(pg.url, made.id)
        while (now := _runner(pg.url, made.id))[0] == owner:
            assert time.time() < killed + lease_ms / 1000 + 10, "the batch was not taken over"
            time.sleep(0.02)
        taken = time.time()
        assert now[0] is not None and _is(now[0], survivor)
        if containers:
            # The survivor cannot see the dead one's processes: it waited for the lease the dead one held.
            assert taken >= lease_until - 0.05, (taken - killed, lease_until - killed)
        else:
            assert taken - killed < lease_ms / 1000 / 2, taken - killed  # its pid is gone: no wait
        survivor_client = sdk(survivor.url, EVAL_KEY)
        batch = wait_batch(survivor_client, made.id)
        out, err = results(survivor_client, batch.output_file_id), results(survivor_client, batch.error_file_id)
    finally:
        a.stop()
        b.stop()
    assert batch.status == "completed" and err == [] and done_at_kill < len(lines)
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]  # each once, in the file's order
    assert all(o["response"]["status_code"] == 200 for o in out)
    # Sent again: only the lines in flight at the kill, once each.
    sends = _sends(pg.url, made.id)
    assert min(sends) == 1 and max(sends) <= 2 and sum(sends) <= len(sends) + CONCURRENCY


def _tails(*gateways: GatewayChild) -> str:
    """What each gateway logged last: why a batch was not taken over, when it was not."""
    return "\n".join(f"{g.log.name}: {g.log.read_text(errors='replace')[-1500:]}" for g in gateways)


def test_another_replica_takes_over_a_stalled_ones_batch(tmp_path: Path, pg: PostgresServer) -> None:
    lines = [line(f"p-{i}", model="slow", prompt=f"prompt {i}") for i in range(120)]
    # Long enough that a holder slowed by a loaded machine (not stalled) keeps renewing it in time.
    lease_ms = 3000
    a, b = _two(tmp_path, pg.url, lease_ms, False)
    try:
        a.wait_ready()
        b.wait_ready()
        client = sdk(a.url, EVAL_KEY)
        made = client.batches.create(
            input_file_id=upload(client, jsonl(lines)), endpoint="/v1/completions", completion_window="24h"
        )
        deadline = time.monotonic() + 30
        while (now := _runner(pg.url, made.id))[1] < 30:
            assert time.monotonic() < deadline, (now, _tails(a, b))
            time.sleep(0.02)
        owner = now[0]
        assert owner is not None
        stalled, survivor = (a, b) if _is(owner, a) else (b, a)
        assert _is(owner, stalled)
        os.kill(stalled.server_pid, signal.SIGSTOP)
        # Counted from the stall: its lease runs out; a transaction it was stopped in is ended after as long, by
        # the database (idle) or by the survivor's claim (inside a statement), its row locks with it; a claim
        # that met those locks is tried again after the ledger's
        # `timeout_ms` (2 s); then the survivor's next poll. The rest is room for a loaded machine.
        by = time.monotonic() + 2 * lease_ms / 1000 + 2 + 20
        try:
            while (now := _runner(pg.url, made.id))[0] == owner:
                assert time.monotonic() < by, ("not taken over", now, time.time(), _tails(survivor))
                time.sleep(0.05)
        finally:
            os.kill(stalled.server_pid, signal.SIGCONT)  # it wakes with lines in flight and a lease it no longer holds
        batch = wait_batch(sdk(survivor.url, EVAL_KEY), made.id)
        assert batch.status == "completed"
        out = results(sdk(survivor.url, EVAL_KEY), batch.output_file_id)
        assert batch.error_file_id is None
    finally:
        a.stop()
        b.stop()
    assert [o["custom_id"] for o in out] == [x["custom_id"] for x in lines]
    sends = _sends(pg.url, made.id)
    # Sent again: at most the lines in flight at the stall, once each (none, when it stopped between two takes).
    assert sum(sends) <= len(sends) + CONCURRENCY and max(sends) <= 2, sorted(sends)[-8:]
