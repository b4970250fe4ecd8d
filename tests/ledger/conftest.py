"""The ledger suite's config and readers: a real SQLite file, or the suite's own PostgreSQL server.

The fake provider's `demo/long` reports prompt_tokens = words in the prompt and completion_tokens =
max_tokens; at the prices below one `body()` (3 words, max_tokens 7) costs 3 x 1000 + 7 x 2000 = 17,000
millionths of a dollar, 17 x 10^9 picodollars.
"""

from __future__ import annotations

from typing import Any, Final

from tests.helpers.sqlite import opened

ADMIN_KEY: Final = "adm-ledger-0d4f"
TEAM_KEY: Final = "gk-ledger-team-61b2"
SOLO_KEY: Final = "gk-ledger-solo-90ce"
ENV: Final = {"LEDGER_ADMIN_KEY": ADMIN_KEY, "LEDGER_TEAM_KEY": TEAM_KEY, "LEDGER_SOLO_KEY": SOLO_KEY}
COST_PICO: Final = 17 * 10**9

CONFIG: Final = """
admin: {{key: "${{LEDGER_ADMIN_KEY}}"}}
logging: {{requests: false}}
retries: {{attempts: 1}}
ledger: {{url: "{url}", flush_ms: {flush_ms}, keys_poll_ms: 200{extra}}}
keys:
  - {{name: alice, key: "${{LEDGER_TEAM_KEY}}", team: blue}}
  - {{name: solo, key: "${{LEDGER_SOLO_KEY}}"}}
teams: {{blue: {{}}, green: {{}}, red: {{}}, "-red": {{}}}}
prices:
  demo/long: {{prompt_per_1m: 1000, completion_per_1m: 2000}}
providers:
  demo: {{kind: fake, models: [long, text]}}
models:
  - {{name: fast, targets: [{{model: demo/long}}]}}
"""


def config(url: str, flush_ms: int = 100, extra: str = "") -> str:
    return CONFIG.format(url=url, flush_ms=flush_ms, extra=extra)


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Read the ledger as an operator would, with the engine's own client library."""
    if url.startswith("sqlite:///"):
        with opened(url[len("sqlite:///") :], timeout=10) as conn:
            return [tuple(r) for r in conn.execute(sql).fetchall()]
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


def totals(url: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(rows, rollups): count, errors, prompt and completion tokens, cost, summed over each table."""
    rows = query(
        url,
        "SELECT count(*), sum(CASE WHEN status >= 400 THEN 1 ELSE 0 END), sum(prompt_tokens), "
        "sum(completion_tokens), sum(cost_pico) FROM requests",
    )[0]
    rolled = query(
        url, "SELECT sum(requests), sum(errors), sum(prompt_tokens), sum(completion_tokens), sum(cost_pico) FROM daily"
    )[0]
    return tuple(int(v or 0) for v in rows), tuple(int(v or 0) for v in rolled)
