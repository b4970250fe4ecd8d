"""A key change whose COMMIT itself outlasts the admin call's wait: the caller was answered 503, and the change
lands afterwards. The database alone knows when a COMMIT ends, so the gateway cannot take it back; it makes it
visible instead: counted (`gateway_ledger_late_changes`), logged, applied by the next key poll, and a create sent
again by the same name is a 409, which tells the client the first one was made. On a real PostgreSQL whose
triggers hold the insert and the COMMIT."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import GatewayThread
from tests.helpers.waiting import wait_until

from .conftest import ENV, config
from .test_keys import admin

# timeout_ms 3000: the call waits 4 s, and a change is committed only if its statements end within 3.5 s. The
# insert takes 2 s (within the statement bound, 1.5 s to spare), its COMMIT 3 s more: it lands at about 5 s,
# a second after the 503.
_SLOW = """
CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN IF NEW.name = 'late' THEN PERFORM pg_sleep(2.0); END IF; RETURN NEW; END $$;
CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN IF NEW.name = 'late' THEN PERFORM pg_sleep(3.0); END IF; RETURN NULL; END $$;
CREATE TRIGGER slow_insert BEFORE INSERT ON api_keys FOR EACH ROW EXECUTE FUNCTION slow_insert();
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON api_keys DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW EXECUTE FUNCTION slow_commit();
"""


def test_a_commit_that_lands_after_the_503_is_counted_and_seen(
    tmp_path: Path, pg: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    import psycopg

    caplog.set_level(logging.INFO, logger="gateway")

    path = tmp_path / "config.yaml"
    path.write_text(config(pg.url, extra=f', timeout_ms: 3000, spill_dir: "{tmp_path / "spill"}"'))
    with GatewayThread(path, ENV) as gw:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute(_SLOW)
        resp = admin(gw.url, "POST", "/admin/keys", {"name": "late"})
        assert resp.status_code == 503, resp.text

        def late() -> float:
            text = httpx.get(f"{gw.url}/metrics", timeout=5, trust_env=False).text
            found = [ln for ln in text.splitlines() if ln.startswith("gateway_ledger_late_changes ")]
            return float(found[0].split()[1]) if found else 0.0

        wait_until(lambda: late() == 1.0, timeout=10, interval=0.1)
        # The next poll sees it; the client that was answered 503 finds it listed, and a create sent again by
        # the same name says it exists.
        listed = admin(gw.url, "GET", "/admin/keys").json()["keys"]
        assert [k["name"] for k in listed] == ["late"]
        again = admin(gw.url, "POST", "/admin/keys", {"name": "late"})
        assert again.status_code == 409 and again.json()["error"]["code"] == "key_exists", again.text
        # Its secret was never shown: a rotation (grace 0) hands the client one, and ends the unknown one at once.
        rotated = admin(gw.url, "POST", f"/admin/keys/{listed[0]['id']}/rotate", {"grace_s": 0})
        assert rotated.status_code == 200 and rotated.json()["secret"], rotated.text
    said = [r.getMessage() for r in caplog.records if "after its caller was answered 503" in r.getMessage()]
    assert len(said) == 1, said
