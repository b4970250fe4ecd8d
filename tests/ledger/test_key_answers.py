"""What `/admin/keys` answers once its change is committed: the change's own answer (a new key's secret, shown
this once), even when reading the keys back right after does not answer; the replicas' pollers apply it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers.clients import client
from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, ENV, config, query
from .test_keys import status


@contextmanager
def _secrets_locked(url: str) -> Iterator[None]:
    """Another session holds `key_secrets`: a key is made without it, but reading the keys back waits on it."""
    import psycopg

    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with psycopg.connect(url) as conn:
            conn.execute("LOCK TABLE key_secrets IN ACCESS EXCLUSIVE MODE")
            taken.set()
            release.wait(30)
            conn.rollback()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert taken.wait(10)
    try:
        yield
    finally:
        release.set()
        holder.join(10)


def test_a_key_made_is_answered_with_its_secret_when_reading_the_keys_back_waits(
    tmp_path: Path, pg: PostgresServer
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config(pg.url, extra=f', timeout_ms: 300, spill_dir: "{tmp_path / "spill"}"'))
    with GatewayThread(path, ENV) as a, GatewayThread(path, ENV) as b:
        with _secrets_locked(pg.url), client(a.url, ADMIN_KEY) as admin:
            resp = admin.post("/admin/keys", json={"name": "ci-bot"})
            assert resp.status_code == 201, resp.text  # committed: its secret is never shown again
            secret = resp.json()["secret"]
        assert query(pg.url, "SELECT name FROM api_keys") == [("ci-bot",)]
        # Both replicas' pollers read it once the lock is gone.
        wait_until(lambda: status(a.url, secret) == 200 and status(b.url, secret) == 200, timeout=5)
