"""Each feature alone, for the bench's ``feature_*`` rows: bench/everything.py's configuration split into its parts.

Every row is one scenario of two targets measured back to back at c=32, every request with a prompt of its own
(a cache miss where the cache is on): the gateway with nothing on, then with exactly one part on. "Nothing on"
turns the access log off, because the gateway logs every request by default (``logging.requests: true``); the
access-log row is therefore the default configuration, the plain ``gateway`` target's, measured beside it.
Limits are keyed on the client's key, so that row also checks the key; the queue-in-Redis row sets
``redis.url``, which also shares target health and usage through Redis.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench import everything

# `--only features` selects every feature_* scenario.
GROUP = "features"
NOTHING = "gateway+nothing"
# Each ratio is against the gateway with nothing on; the goal is at most a tenth of its throughput per feature.
RATIO_GOAL = 0.90


@dataclass(frozen=True)
class Feature:
    name: str
    # What the report's row says the feature is.
    what: str
    redis: bool = False

    @property
    def scenario(self) -> str:
        return f"feature_{self.name.replace('-', '_')}_c32"

    @property
    def target(self) -> str:
        return f"gateway+only-{self.name}"


FEATURES = (
    Feature("limits", "rpm + tpm limits on the client's key, in Redis", redis=True),
    Feature("cache", "response cache `mode: always`, every request a miss"),
    Feature("ledger", "ledger on SQLite"),
    Feature("queue", "`max_concurrency` far above the load, in process"),
    Feature("queue-redis", "`max_concurrency` far above the load, with `redis.url`", redis=True),
    Feature("log", "access log (on by default: the plain gateway's configuration)"),
)
SCENARIOS = tuple(f.scenario for f in FEATURES)
TARGETS = (NOTHING, *(f.target for f in FEATURES))
REDIS_TARGETS = tuple(f.target for f in FEATURES if f.redis)
_BY_NAME = {f.name: f for f in FEATURES}


def fragment(name: str, redis_url: str | None, work_dir: Path, tag: str) -> dict[str, object]:
    """What is merged into the bench's gateway config: the access log off, then feature ``name`` on
    (``nothing``: none). Each part's top-level keys differ from the others', so a plain union merges them."""
    base: dict[str, object] = {"logging": {"requests": False}}
    if name != "nothing" and _BY_NAME[name].redis and not redis_url:
        raise ValueError(f"feature {name} needs the bench's Redis")
    redis = redis_url or ""
    match name:
        case "nothing":
            part: dict[str, object] = {}
        case "limits":
            part = everything.limits(redis)
        case "cache":
            part = everything.CACHE
        case "ledger":
            part = everything.ledger(everything.sqlite_url(work_dir, tag))
        case "queue":
            part = everything.QUEUE
        case "queue-redis":
            part = {"redis": {"url": redis}, **everything.QUEUE}
        case "log":
            part = everything.ACCESS_LOG
        case _:
            raise ValueError(f"no feature {name!r}")
    return {**base, **part}
