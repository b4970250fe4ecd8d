"""What `serve` checks in its main process before any worker starts (gateway/__main__.py).

A database that cannot be reached, a schema newer than the code or a runtime key named like a YAML key of
its namespace is one line and exit status 1. This module imports only the engine, the schema and the
namespaces: the main process must not import gateway.ids (through the writer or the key ring's limits),
whose per-process id prefix each worker Granian forks has to draw for itself.
"""

from __future__ import annotations

import logging

from gateway.config import ConfigError, LoadedConfig
from gateway.ledger.engine import Cursor, Database, LedgerDown
from gateway.ledger.namespaces import YamlKeys, takes_yaml_name, yaml_keys
from gateway.ledger.schema import VERSION, SchemaError

log = logging.getLogger("gateway")


def clashes(cur: Cursor, yaml: YamlKeys) -> list[str]:
    """Runtime keys (`team/name`) whose name a YAML key holds in their namespace (gateway/ledger/namespaces.py)."""
    found = cur.rows("SELECT name, team FROM api_keys WHERE revoked_at IS NULL")
    taken = [(name, team) for name, team in found if takes_yaml_name(name, team, yaml)]
    return sorted(name if team is None else f"{team}/{name}" for name, team in taken)


def census(cur: Cursor) -> tuple[int, bool]:
    """Runtime keys not revoked, and whether the ledger ever held one."""
    live = int(cur.rows("SELECT count(*) FROM api_keys WHERE revoked_at IS NULL")[0][0])
    return live, live > 0 or bool(cur.rows("SELECT 1 FROM api_keys LIMIT 1"))


def prepare(loaded: LoadedConfig) -> tuple[int, bool]:
    """Migrate, refuse runtime keys named like YAML ones: a `ConfigError` line otherwise (the URL's form was
    checked with the rest of the config, by `load_config`, as `check-config` checks it). The runtime keys
    not revoked, and whether any was ever made (for the start-up line on keyless requests)."""
    db = Database(loaded.config.ledger.url)
    yaml = yaml_keys((k.name, k.team) for k in loaded.config.keys)
    try:
        db.migrate()
        clash = db.transaction(lambda cur: clashes(cur, yaml))
        found = db.transaction(census)
    except (LedgerDown, SchemaError) as exc:
        raise ConfigError(f"{loaded.source}: ledger: {exc}") from None
    finally:
        db.close()
    if clash:
        raise ConfigError(
            f"{loaded.source}: keys: {', '.join(repr(n) for n in clash)} also named by a runtime key in the ledger "
            "(rename the YAML key or revoke the runtime one)"
        )
    log.info("ledger: %s at schema version %d", db.where, VERSION)
    return found
