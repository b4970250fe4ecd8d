"""Who may set the request body's `priority`: the scheduling priority a self-hosted engine (run with
priority scheduling) orders its own waiting requests by, in front of every other tenant's.

The gateway's classes (`x-gateway-priority`) are checked against the key's `max_priority`; the engine's
number would bypass them, so only a key that may ask for `high` may send it, and never a batch line, which
runs below every interactive request. A gateway without keys has one tenant, whose requests may. A request
without `priority` costs one attribute read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gateway.config import LoadedConfig, TeamConfig
from gateway.limits.auth import ClientKey
from wire.errors import PermissionDeniedError

FIELD: Final = "priority"


class EngineGrant:
    """The keys of one config that may set the body's `priority` (a runtime key's own `max_priority`, else
    its team's, is read from it)."""

    def __init__(self, loaded: LoadedConfig) -> None:
        cfg = loaded.config
        self._teams: Mapping[str, TeamConfig] = cfg.teams
        # A YAML key's limit is the config's (its ClientKey carries none): its own, else its team's, else normal.
        self._most = {k.name: self._resolve(k.max_priority, k.team) for k in cfg.keys}

    def _resolve(self, most: str | None, team_name: str | None) -> str:
        team = self._teams.get(team_name) if team_name else None
        return most or (team.max_priority if team else None) or "normal"

    def check(self, key: ClientKey | None, batch: bool) -> None:
        """Refuse (403, naming `priority`) a body priority `key` may not set."""
        if batch:
            raise PermissionDeniedError(
                f"A batch line may not set '{FIELD}' (the engine's scheduling priority): lines run after every "
                "interactive request",
                param=FIELD,
                code="priority_not_allowed",
            )
        if key is None:  # no keys in force (a key is required once any exists): no tenant to overtake
            return
        found = self._most.get(key.label)  # a YAML key's: a runtime key of a team named alike is not it
        most = found if found is not None else self._resolve(key.max_priority, key.team)
        if most != "high":
            raise PermissionDeniedError(
                f"This key may not set '{FIELD}' (the engine's scheduling priority): only a key whose "
                f"max_priority is 'high' may, and its max_priority is '{most}'",
                param=FIELD,
                code="priority_not_allowed",
            )
