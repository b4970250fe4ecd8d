"""Where a key's name must be unique: a team's keys (YAML and runtime) share one namespace, each team its own.

The operator's runtime keys of no team and every YAML key share one more: the operator writes both, the
config keeps its names unique across teams, and the operator's usage views name those keys bare, a runtime
key of a team as `team/name` (gateway/limits/auth.py `shown_as`). So a team admin's key may take a name
another team uses, in the ledger or in the config, and a refusal never tells it what other teams hold.
Docs: docs/security.md#admin-roles.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# The config's keys: name -> the teams (None: no team) of the YAML keys of that name.
YamlKeys = Mapping[str, frozenset[str | None]]


def yaml_keys(pairs: Iterable[tuple[str, str | None]]) -> YamlKeys:
    """The config's keys, from each one's (name, team)."""
    out: dict[str, set[str | None]] = {}
    for name, team in pairs:
        out.setdefault(name, set()).add(team)
    return {name: frozenset(teams) for name, teams in out.items()}


def takes_yaml_name(name: str, team: str | None, yaml: YamlKeys) -> bool:
    """Whether a runtime key `name` of `team` takes a name of the config's own namespace: a YAML key's of its
    team, or for the operator's key of no team, any YAML key's."""
    teams = yaml.get(name)
    return teams is not None and (team is None or team in teams)
