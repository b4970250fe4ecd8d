"""What `/admin/keys` answers: once a change is committed, the change's own answer (a new key's secret, shown
this once), even when reading the keys back right after does not answer; a key's rates up to their bound, and
keys stored with more, served and listed."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gateway.config import QUEUE_MAX_MS, RATE_MAX
from tests.helpers.clients import client
from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread
from tests.helpers.sqlite import opened
from tests.helpers.waiting import wait_until

from .conftest import ADMIN_KEY, ENV, config, query
from .test_keys import admin, status


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


def test_rates_at_the_bound_are_served_and_keys_stored_past_it_too(tmp_path: Path) -> None:
    """A rate of `RATE_MAX` is a key's own; a key a gateway made before rates were bounded, with more than a
    float holds, is listed and served as one at the bound, never a 500."""
    db = tmp_path / "ledger.db"
    path = tmp_path / "config.yaml"
    path.write_text(config(f"sqlite:///{db}"))
    with GatewayThread(path, ENV) as gw:
        made = admin(
            gw.url, "POST", "/admin/keys", {"name": "fast", "limits": {"rpm": RATE_MAX, "concurrent": RATE_MAX}}
        )
        assert made.status_code == 201, made.text
        assert status(gw.url, made.json()["secret"]) == 200
        old = "gwk-made-before-rates-were-bounded"
        past = '{"rpm": 1' + "0" * 400 + ', "concurrent": 1' + "0" * 400 + ', "max_queue_ms": 1' + "0" * 30 + "}"
        with opened(db) as conn:
            conn.execute(
                "INSERT INTO api_keys (id, name, team, models, max_cost_per_day, expires_at, digest, created_at, "
                "limits) VALUES ('key_old', 'veteran', NULL, '[\"**\"]', NULL, NULL, ?, 0, ?)",
                (hashlib.sha256(old.encode()).hexdigest(), past),
            )
            conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'keys'")
        wait_until(lambda: status(gw.url, old) == 200, timeout=5)
        listed = admin(gw.url, "GET", "/admin/keys")
        assert listed.status_code == 200, listed.text
        veteran = next(k for k in listed.json()["keys"] if k["name"] == "veteran")
        bounded = {k: veteran["limits"][k] for k in ("rpm", "concurrent", "max_queue_ms")}
        assert bounded == {"rpm": RATE_MAX, "concurrent": RATE_MAX, "max_queue_ms": QUEUE_MAX_MS}


def test_two_replicas_rotating_one_key_at_once_both_hand_out_working_secrets(
    tmp_path: Path, pg: PostgresServer
) -> None:
    """Each rotation's secret works, and the one before it keeps its grace: the second rotation starts from the
    first one's secret, never from the secret both found (which the second could not keep, and whose
    successor it would drop)."""
    import psycopg

    path = tmp_path / "config.yaml"
    path.write_text(config(pg.url, extra=f', timeout_ms: 5000, spill_dir: "{tmp_path / "spill"}"'))
    with GatewayThread(path, ENV) as a, GatewayThread(path, ENV) as b:
        made = admin(a.url, "POST", "/admin/keys", {"name": "ci-bot"})
        first, key_id = made.json()["secret"], made.json()["key"]["id"]
        answers: dict[str, Any] = {}

        def rotate(url: str) -> None:
            answers[url] = admin(url, "POST", f"/admin/keys/{key_id}/rotate", {"grace_s": 600})

        # Another session holds the key's row, so that both rotations are under way before either commits.
        with psycopg.connect(pg.url) as holder:
            holder.execute("SELECT 1 FROM api_keys WHERE id = %s FOR UPDATE", (key_id,))
            threads = [threading.Thread(target=rotate, args=(url,)) for url in (a.url, b.url)]
            for t in threads:
                t.start()
            time.sleep(1.5)
            holder.rollback()
        for t in threads:
            t.join(15)
        assert [r.status_code for r in answers.values()] == [200, 200], [r.text for r in answers.values()]
        secrets = [first, *(r.json()["secret"] for r in answers.values())]
        for url in (a.url, b.url):
            wait_until(lambda url=url: [status(url, s) for s in secrets] == [200, 200, 200], timeout=5)


def test_a_key_the_ledger_answered_503_for_is_not_made_after_all(tmp_path: Path, pg: PostgresServer) -> None:
    """A creation whose statements each waited a while, together past the admin call's bound: the client is
    answered 503 and the key is not made behind its back (a name taken, and a secret nobody was shown); the
    same request sent again makes it."""
    import psycopg

    path = tmp_path / "config.yaml"
    path.write_text(config(pg.url, extra=f', spill_dir: "{tmp_path / "spill"}"'))  # timeout_ms: 2000
    with GatewayThread(path, ENV) as gw:
        answers: list[Any] = []
        with psycopg.connect(pg.url) as name, psycopg.connect(pg.url) as counter:
            # The name, taken by a transaction not yet decided; the keys' change counter, held.
            name.execute(
                "INSERT INTO api_keys (id, name, models, digest, created_at) VALUES ('key_x', 'ci-bot', '[]', 'x', 0)"
            )
            counter.execute("SELECT value FROM counters WHERE name = 'keys' FOR UPDATE")
            sent = threading.Thread(
                target=lambda: answers.append(admin(gw.url, "POST", "/admin/keys", {"name": "ci-bot"}))
            )
            sent.start()
            time.sleep(1.6)
            name.rollback()  # the insert goes on, then waits for the counter
            time.sleep(1.6)
            counter.rollback()
            sent.join(10)
        [answer] = answers
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "ledger_unavailable"
        time.sleep(1.0)
        assert query(pg.url, "SELECT name FROM api_keys") == []
        again = admin(gw.url, "POST", "/admin/keys", {"name": "ci-bot"})
        assert again.status_code == 201, again.text
