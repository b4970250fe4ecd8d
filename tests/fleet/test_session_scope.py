"""Session affinity is scoped by key: one key's session id neither finds nor crowds another key's session
(docs/fleets.md), unless the operator shares sessions across keys (`session_scope: shared`)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.helpers.servers import serve_config
from tests.helpers.upstreams import Upstream

from .conftest import fleet_config

ALPHA, BETA, GAMMA = "gk-alpha-session-7f21", "gk-beta-session-0c9e", "gk-gamma-session-44d1"
KEYS = f"""keys:
  - {{name: alpha, key: "{ALPHA}", team: red}}
  - {{name: beta, key: "{BETA}", team: blue}}
  - {{name: gamma, key: "{GAMMA}", team: red}}
teams: {{red: {{}}, blue: {{}}}}
"""
SESSIONS = [f"trajectory-{n}" for n in range(12)]


def homes(gw_url: str, secret: str, *, user: bool = False) -> list[int]:
    """The replica each of SESSIONS lands on for one key (twice each: a session sticks)."""
    out: list[int] = []
    with httpx.Client(base_url=gw_url, trust_env=False, timeout=15) as c:
        for s in SESSIONS:
            got = set()
            for _ in range(2):
                body = {"model": "engine/m", "prompt": "next turn", **({"user": s} if user else {})}
                headers = {"authorization": f"Bearer {secret}", **({} if user else {"x-session-id": s})}
                r = c.post("/v1/completions", json=body, headers=headers)
                assert r.status_code == 200, r.text
                got.add(int(r.headers["x-gateway-model"].split("@")[1].split("/")[0]))
            assert len(got) == 1, (s, got)
            out.append(got.pop())
    return out


def test_one_keys_session_id_lands_apart_from_the_same_id_of_another_key(
    tmp_path: Path, replicas: list[Upstream]
) -> None:
    config = fleet_config(replicas, "policy: session") + KEYS
    with serve_config(tmp_path, config) as gw:
        alpha, beta = homes(gw.url, ALPHA), homes(gw.url, BETA)
        # The same twelve ids, hashed with each key's identity, are placed independently: were they shared,
        # beta could read (from `x-gateway-model`) where each of alpha's sessions lives and crowd it.
        assert alpha != beta, (alpha, beta)
        assert homes(gw.url, ALPHA, user=True) != homes(gw.url, BETA, user=True)  # `user` too
        assert len(set(alpha)) > 1


def test_sessions_are_shared_by_a_team_or_by_all_when_the_operator_says_so(
    tmp_path: Path, replicas: list[Upstream]
) -> None:
    config = fleet_config(replicas, "policy: session, session_scope: team") + KEYS
    with serve_config(tmp_path, config) as gw:
        alpha, beta, gamma = homes(gw.url, ALPHA), homes(gw.url, BETA), homes(gw.url, GAMMA)
        assert alpha == gamma and alpha != beta, (alpha, beta, gamma)
    config = fleet_config(replicas, "policy: session, session_scope: shared") + KEYS
    with serve_config(tmp_path, config) as gw:
        assert homes(gw.url, ALPHA) == homes(gw.url, BETA) == homes(gw.url, GAMMA)
