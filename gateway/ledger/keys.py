"""Client keys made at runtime (`/admin/keys`), stored in the ledger beside the YAML ones.

The ledger keeps a key's SHA-256 and a stable public id, never its secret: the secret is shown once,
when the key is made or rotated. A rotation keeps the previous secret valid until its grace ends. Every
change bumps one counter in the same transaction; each replica reads that counter every
`ledger.keys_poll_ms` and reloads the keys only when it moved, so a new, rotated or revoked key applies
on every replica within that time while authentication stays one dictionary lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Collection
from typing import Any, Final

import msgspec

from gateway.config import LimitsConfig
from gateway.ledger.book import Ledger
from gateway.ledger.engine import Cursor, LedgerDown
from gateway.limits.admission import buckets_of
from gateway.limits.auth import ClientKey, RuntimeKeys
from gateway.limits.globs import ModelGlobs

log = logging.getLogger("gateway")

_FIELDS: Final = (
    "id, name, team, models, max_cost_per_day, expires_at, digest, old_digest, old_valid_until, created_at, limits, "
    "max_cost_per_month"
)
_BUMP: Final = "UPDATE counters SET value = value + 1 WHERE name = 'keys'"


class KeyRow(msgspec.Struct, frozen=True):
    """A runtime key as `GET /admin/keys` lists it (no secret, no digest)."""

    id: str
    name: str
    team: str | None
    models: list[str]
    max_cost_per_day: float | None
    expires_at: float | None
    created_at: float
    rotated_grace_until: float | None = None
    limits: LimitsConfig | None = None
    max_cost_per_month: float | None = None


class Issued(msgspec.Struct, frozen=True):
    """A key and its secret: the only answer that ever holds the secret."""

    key: KeyRow
    secret: str


class KeyConflict(Exception):
    pass


class KeyNotFound(Exception):
    pass


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _secret() -> str:
    return "gwk-" + secrets.token_urlsafe(32)


def _row(r: tuple[Any, ...]) -> KeyRow:
    return KeyRow(
        id=r[0],
        name=r[1],
        team=r[2],
        models=msgspec.json.decode(r[3], type=list[str]),
        max_cost_per_day=r[4],
        expires_at=r[5],
        created_at=r[9],
        rotated_grace_until=r[8],
        limits=_limits(r[10]),
        max_cost_per_month=r[11],
    )


def _limits(stored: str | None) -> LimitsConfig | None:
    return None if stored is None else msgspec.json.decode(stored, type=LimitsConfig)


# ---------------------------------------------------------------------------- on the ledger's thread


def create(
    cur: Cursor,
    name: str,
    team: str | None,
    models: list[str],
    max_cost_per_day: float | None,
    expires_at: float | None,
    limits: LimitsConfig | None = None,
    max_cost_per_month: float | None = None,
) -> Issued:
    if cur.rows("SELECT id FROM api_keys WHERE name = ?", (name,)):
        raise KeyConflict(f"a key named {name!r} exists already")
    key_id = "key_" + secrets.token_hex(8)
    secret = _secret()
    now = round(time.time(), 3)
    cur.execute(
        f"INSERT INTO api_keys ({_FIELDS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?, ?)",
        (key_id, name, team, msgspec.json.encode(models).decode(), max_cost_per_day, expires_at, _digest(secret), now)
        + (None if limits is None else msgspec.json.encode(limits).decode(), max_cost_per_month),
    )
    cur.execute(_BUMP)
    row = KeyRow(key_id, name, team, models, max_cost_per_day, expires_at, now, None, limits, max_cost_per_month)
    return Issued(row, secret)


def rotate(cur: Cursor, key_id: str, grace_s: float) -> Issued:
    found = cur.rows(f"SELECT {_FIELDS} FROM api_keys WHERE id = ? AND revoked_at IS NULL", (key_id,))
    if not found:
        raise KeyNotFound(key_id)
    secret = _secret()
    until = round(time.time() + grace_s, 3)
    cur.execute(
        "UPDATE api_keys SET old_digest = digest, old_valid_until = ?, digest = ? WHERE id = ?",
        (until, _digest(secret), key_id),
    )
    cur.execute(_BUMP)
    r = found[0]
    return Issued(_row((*r[:8], until, *r[9:])), secret)


def revoke(cur: Cursor, key_id: str) -> None:
    if not cur.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (time.time(), key_id)):
        raise KeyNotFound(key_id)
    cur.execute(_BUMP)


def listing(cur: Cursor) -> list[KeyRow]:
    return [_row(r) for r in cur.rows(f"SELECT {_FIELDS} FROM api_keys WHERE revoked_at IS NULL ORDER BY created_at")]


def version(cur: Cursor) -> int:
    return int(cur.rows("SELECT value FROM counters WHERE name = 'keys'")[0][0])


def load(cur: Cursor) -> tuple[int, list[tuple[Any, ...]]]:
    rows = cur.rows(f"SELECT {_FIELDS} FROM api_keys WHERE revoked_at IS NULL")
    return version(cur), rows


# ---------------------------------------------------------------------------- on the event loop


def _ring(rows: list[tuple[Any, ...]]) -> dict[bytes, ClientKey]:
    out: dict[bytes, ClientKey] = {}
    for r in rows:
        models = ModelGlobs(msgspec.json.decode(r[3], type=list[str]))
        expires = r[5]
        digest = bytes.fromhex(r[6])
        limits = _limits(r[10])
        buckets = tuple(buckets_of(f"key:{r[1]}", limits))
        queue_ms = limits.max_queue_ms if limits is not None else 0
        key = ClientKey(r[1], b"", models, digest, expires, r[4], buckets, r[11], queue_ms)
        out[digest] = key
        if r[7] is not None:
            old = bytes.fromhex(r[7])
            until = r[8] if expires is None else min(r[8], expires)
            if until > time.time():
                out[old] = msgspec.structs.replace(key, digest=old, valid_until=until)
    return out


class KeyPoller:
    """Keeps `runtime` equal to the ledger's keys: reads the version every `keys_poll_ms`, reloads on a change."""

    def __init__(
        self, ledger: Ledger, runtime: RuntimeKeys, yaml_names: Collection[str], on_teams: Callable[[], None]
    ) -> None:
        self.ledger = ledger
        self.runtime = runtime
        self.yaml_names = set(yaml_names)
        self.on_teams = on_teams
        self.seen = -1
        self.teams: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None

    async def refresh(self, *, force: bool = False) -> None:
        if not force:
            current = await self.ledger.call(self.ledger.db.transaction, version)
            if current == self.seen:
                return
        seen, rows = await self.ledger.call(self.ledger.db.transaction, load)
        clash = sorted({r[1] for r in rows} & self.yaml_names)
        if clash:
            # Refused at start-up; here only if a key was made on a replica whose YAML lacked the name.
            log.error("ledger: runtime key name(s) %s also in keys: (YAML); those runtime keys are ignored", clash)
            rows = [r for r in rows if r[1] not in self.yaml_names]
        self.runtime.by_digest = _ring(rows)
        self.teams = {r[1]: r[2] for r in rows if r[2]}
        self.on_teams()
        self.seen = seen

    async def start(self) -> None:
        await self.refresh(force=True)
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        interval = self.ledger.cfg.keys_poll_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh()
            except LedgerDown:
                pass  # the keys in force stay; the writer logs the outage
            except Exception:
                log.exception("ledger: reading the runtime keys failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
