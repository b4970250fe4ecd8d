"""A lease holder that shares this process's host name is taken for gone only when it ran on this machine, in
this boot and PID namespace, and its pid is dead. Two machines can share a host name (cloned VMs, a default
name) and their first PID namespace's number (every Linux machine's is the same): a runner of the other one
is alive though its pid is dead here, or is this process's own pid, and its batch waits for its lease.

One `Store` of the gateway's own on a real SQLite file stands for this replica; the holders are rows as
another replica's runner writes them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gateway.batches import leases, store
from gateway.ledger.engine import Database

LEASE_S = 60.0


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


async def test_a_runner_of_another_machine_with_this_host_name_keeps_its_batch(tmp_path: Path) -> None:
    me = leases.owner_name()
    host, boot, namespace, _, _ = me.split(":")
    other_boot = "0" * len(boot)
    dead = _dead_pid()
    elsewhere = [
        f"{host}:{other_boot}:{namespace}:{dead}:aaaa",  # its pid is dead here, alive there
        f"{host}:{other_boot}:{namespace}:{os.getpid()}:bbbb",  # this process's pid, another process there
    ]
    here_dead = f"{host}:{boot}:{namespace}:{dead}:cccc"  # a runner of this machine that has ended
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    schema = Database(url)
    schema.migrate()
    schema.close()
    db = store.Store(url, 500)
    try:
        batches = {}
        for holder in [*elsewhere, here_dead]:
            batch_id = await db.run(store.add_batch, "owner", "file-x", "/v1/completions", "24h", 86_400.0, None, 100)
            assert await db.run(leases.claim, holder, LEASE_S, [], {}) == batch_id
            batches[holder] = batch_id
        for holder in elsewhere:
            assert not leases.gone(holder, me)
        assert leases.gone(here_dead, me)
        # Only the dead runner's batch of this machine is taken, at once; the others wait for their leases.
        assert await db.run(leases.claim, me, LEASE_S, [], {}) == batches[here_dead]
        assert await db.run(leases.claim, me, LEASE_S, [batches[here_dead]], {}) is None
        owners = await db.run(lambda cur: dict(cur.rows("SELECT id, lease_owner FROM batches")))
    finally:
        await db.close()
    assert owners == {batches[h]: h for h in elsewhere} | {batches[here_dead]: me}
