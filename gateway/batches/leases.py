"""Who runs a batch: its lease (`lease_owner`, `lease_until`), taken, renewed, handed back and taken over.

A process claims a batch whose lease is free (new, handed back, run out, or held by a process of this
machine's boot and PID namespace that is gone) and renews it with every write it makes (`held`); a process
that lost it (it stalled, another took the batch over) gets `LostLease` and writes nothing more. Claims are
fair between keys: the oldest batch of the key this process runs fewest batches of comes first.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.batches.objects import ACTIVE, SENT, TODO
from gateway.ledger.engine import Cursor


class LostLease(Exception):
    """This process no longer holds the batch's lease: another took it over, or the batch is gone."""


def _claimable(cur: Cursor, me: str, now: float) -> list[tuple[Any, ...]]:
    """(id, lease holder, lease end, key) of the batches with work left whose lease is free, oldest first:
    each key's oldest (however many older ones another key has waiting), and those of a gone runner here."""
    marks = ", ".join("?" * len(ACTIVE))
    free = cur.rows(
        f"SELECT id, lease_owner, lease_until, owner FROM batches b WHERE status IN ({marks}) AND lease_until < ? "
        f"AND NOT EXISTS (SELECT 1 FROM batches o WHERE o.owner = b.owner AND o.status IN ({marks}) "
        "AND o.lease_until < ? AND o.created_at < b.created_at) ORDER BY created_at LIMIT 64",
        (*ACTIVE, now, *ACTIVE, now),
    )
    here = ":".join(me.split(":")[:3]) + ":"  # this boot and PID namespace: the runners `gone` can see
    return free + [
        row
        for row in cur.rows(
            f"SELECT id, lease_owner, lease_until, owner FROM batches WHERE status IN ({marks}) "
            "AND lease_until >= ? AND lease_owner LIKE ? ORDER BY created_at LIMIT 64",
            (*ACTIVE, now, here + "%"),
        )
        if gone(row[1], me)
    ]


def waiting_keys(cur: Cursor, me: str) -> set[str]:
    """The keys whose batches wait for a runner."""
    return {str(row[3]) for row in _claimable(cur, me, time.time())}


def claim(cur: Cursor, me: str, lease_s: float, busy: Sequence[str], driven: Mapping[str, int]) -> str | None:
    """Take a batch with work left whose lease is free: new, handed back, its lease run out, or held by a
    process of this machine's boot and PID namespace that is gone (a gateway restarted after a SIGKILL resumes
    its batches at once, without waiting for their leases). The oldest of the key this process runs fewest
    batches of (`driven`, by key), so that one key's batches do not hold every slot while another's wait.

    Lines a dead runner had sent are sent again: their answers were never booked (so each crash sends a
    line in flight at most once more)."""
    now = time.time()
    candidates = sorted(_claimable(cur, me, now), key=lambda row: driven.get(str(row[3]), 0))  # stable: oldest first
    for batch_id, owner, until, _ in candidates:
        if batch_id in busy:
            continue
        if cur.postgres and owner is not None and until > 0:  # a lease that ran out: its holder may have stalled
            _end_stalled_holder(cur, batch_id, lease_s)
        # Compare and set: another process claiming the same batch now changes what this one matches.
        if cur.execute(
            "UPDATE batches SET lease_owner = ?, lease_until = ? WHERE id = ? AND lease_until = ? "
            "AND coalesce(lease_owner, '') = ?",
            (me, now + lease_s, batch_id, until, owner or ""),
        ):
            cur.execute(f"UPDATE batch_lines SET state = '{TODO}' WHERE batch_id = ? AND state = '{SENT}'", (batch_id,))
            return str(batch_id)
    return None


def _end_stalled_holder(cur: Cursor, batch_id: str, lease_s: float) -> None:
    """PostgreSQL: end the session that holds the batch's row locked while it has waited on its client (to
    read from it or write to it) for longer than a lease, inside a statement or idle in its transaction. Its
    process stalled: inside a statement (between a pipeline's statements and its closing Sync, inside a COPY,
    part-way through a long message or a long result) no timeout of the server fires, and a session idle in a
    transaction was seen to outlive its `idle_in_transaction_session_timeout` under load. Its locks would keep
    the batch from any other runner until the process woke. A live runner never waits on itself that long;
    its lease has run out, so it has lost the batch anyway."""
    cur.rows(
        "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a "
        "WHERE a.backend_xid = (SELECT xmax FROM batches WHERE id = ?) AND a.pid <> pg_backend_pid() "
        "AND a.state IN ('active', 'idle in transaction', 'idle in transaction (aborted)') "
        "AND a.wait_event_type = 'Client' "
        "AND a.state_change < now() - make_interval(secs => ?) "
        # Only a session it may end (its own role's): ending another role's would fail the claim instead.
        "AND pg_has_role(a.usesysid, 'MEMBER')",
        (batch_id, lease_s),
    )


def owner_name() -> str:
    """This process as a lease holder: host name, boot, PID namespace, pid, and a random part that no later
    process with its pid shares. The boot tells two machines of one host name apart, whose PID namespaces can
    have the same number (every machine's first namespace has the same one); the namespace tells two
    containers of one machine apart (both PID 1, say)."""
    return f"{socket.gethostname()}:{_boot()}:{_pid_namespace()}:{os.getpid()}:{os.urandom(4).hex()}"


def _boot() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace(":", "")
    except OSError:
        # No boot id to match: no other process counts as this machine's, and a dead one's batches wait for
        # its lease, rather than a live runner of another machine being taken for a dead one here.
        return os.urandom(8).hex()


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"  # no /proc: one namespace for the whole machine


def gone(owner: str | None, me: str) -> bool:
    """Whether `owner`, a runner of this machine's boot and PID namespace, has ended: its pid is not alive, or
    is this process's own under another name (a restart that reused the pid). A runner of another machine, of
    an earlier boot or of another namespace (another container) cannot be seen from here: its batches wait for
    its lease to run out."""
    if owner is None or owner == me:
        return False
    parts, mine = owner.split(":"), me.split(":")
    if len(parts) != 5 or parts[:3] != mine[:3] or not parts[3].isdigit():
        return False
    pid = int(parts[3])
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another user's
    return False


def held(cur: Cursor, batch_id: str, me: str, lease_s: float) -> tuple[Any, ...]:
    """The batch's status, expiry and input file, its lease renewed; `LostLease` when another holds it."""
    # The renewal is the check, not a read before it: on PostgreSQL a read does not wait for another
    # process's claim being committed and would still name this one; the update waits for it, then matches
    # nothing. The row is locked from here to the commit, so what is read next stays true.
    if not cur.execute(
        "UPDATE batches SET lease_until = ? WHERE id = ? AND lease_owner = ?", (time.time() + lease_s, batch_id, me)
    ):
        raise LostLease(batch_id)
    return cur.rows(
        "SELECT status, expires_at, input_file_id, endpoint, owner, lease_owner FROM batches WHERE id = ?", (batch_id,)
    )[0]


def release(cur: Cursor, batch_id: str, me: str) -> None:
    """Give the lease back (a clean stop): the next runner, here or elsewhere, takes the batch at once."""
    cur.execute("UPDATE batches SET lease_until = 0 WHERE id = ? AND lease_owner = ?", (batch_id, me))
