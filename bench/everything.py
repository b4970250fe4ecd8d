"""The configuration a platform team runs, for the bench's ``all_*`` rows: every feature on at once.

Redis-backed rpm + tpm limits on the client's key, the response cache (`mode: always`, the memory store;
the rows that send a unique prompt per request make every request a miss), the ledger (SQLite, or the
PostgreSQL the bench starts), `max_concurrency` far above the connection count (the fair queue is on but
never makes a request wait) and the access log (on by default). Limits are set far above what a run can
reach, so every request is checked and charged but none is refused.
"""

from __future__ import annotations

from pathlib import Path

# Targets: the gateway with everything on, on a SQLite or a PostgreSQL ledger, with one or two workers;
# and the passthrough as two processes sharing the port, the floor for two workers.
EVERYTHING = "gateway+all"
EVERYTHING_PG = "gateway+all-pg"
EVERYTHING_2W = "gateway+all-2w"
PASSTHROUGH_2W = "passthrough-2w"
EVERYTHING_TARGETS = (EVERYTHING, EVERYTHING_PG, EVERYTHING_2W)

# `--only everything` selects these scenarios (bench/scenarios.py defines them).
GROUP = "everything"
SCENARIOS = (
    "all_c32",
    "all_hits_c32",
    "all_chat_c32",
    "all_stream_c32",
    "all_chat_stream_c32",
    "all_c1",
    "all_chat_c1",
    "all_2w_c32",
)

KEY = "bench-key"
CHAT_REQUEST: dict[str, object] = {
    "model": "up/bench-model",
    "messages": [{"role": "user", "content": "Say hello"}],
    "max_tokens": 16,
}


def limits(redis_url: str) -> dict[str, object]:
    """rpm + tpm limits on the client's key, kept in Redis."""
    return {
        "redis": {"url": redis_url},
        "keys": [{"name": "bench", "key": KEY, "limits": {"rpm": 100_000_000, "tpm": 10_000_000_000}}],
    }


# The response cache (every request of a varied load a miss), the fair queue far above the load, the access log.
CACHE: dict[str, object] = {"cache": {"mode": "always"}}
QUEUE: dict[str, object] = {"providers": {"up": {"max_concurrency": 100_000}}}
ACCESS_LOG: dict[str, object] = {"logging": {"requests": True}}


def ledger(url: str) -> dict[str, object]:
    return {"ledger": {"url": url}}


def fragment(redis_url: str, ledger_url: str) -> dict[str, object]:
    """What is merged into the bench's gateway config for an everything-on target: the parts above at once
    (bench/features.py measures each alone). Their top-level keys differ, so a plain union merges them."""
    return {**limits(redis_url), **CACHE, **ledger(ledger_url), **QUEUE, **ACCESS_LOG}


def sqlite_url(work_dir: Path, tag: str) -> str:
    return f"sqlite:///{work_dir / f'ledger-{tag}.db'}"
