"""A hedged call that did not serve its request is still paid for, and booked (docs/ledger.md "Hedges").

The loser of a race and, when the client leaves during a hedge, every call then running: each is booked
beside the request at its own target's price, against the same key. The usage views, the budgets and the
ledger read the same bookings. Real sockets: the gateway under uvicorn, loopback upstreams, a SQLite ledger
read back with sqlite3.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.limits.usage import day_of
from tests.e2e.test_observability import metric
from tests.helpers.faults import FaultServer, good, hang, slow, stream
from tests.helpers.postgres import PostgresServer
from tests.helpers.servers import serve_config
from tests.helpers.sqlite import opened
from tests.helpers.waiting import wait_until

ADMIN = "adm-hedge-usage-5be1"
KEY = "gk-hedge-usage-77c0"
PICO = 10**12
# alpha's prompt costs $1000 per million tokens, beta's $3000 (completion: $2000, $4000).
ALPHA_PROMPT, BETA_PROMPT, BETA_COMPLETION = 1000 * 10**6, 3000 * 10**6, 4000 * 10**6
PROMPT = "Say this is a test"  # 5 tokens as the gateway estimates them


def config(faults: FaultServer, ledger: str | None) -> str:
    return (
        f'admin: {{key: "{ADMIN}"}}\n'
        + (f'ledger: {{url: "{ledger}", flush_ms: 50}}\n' if ledger else "")
        + "timeouts: {first_byte_ms: 60000, total_ms: 600000}\n"
        f'keys:\n  - {{name: ci, key: "{KEY}", team: red, max_cost_per_day: 100}}\n'
        "teams: {red: {}}\n"
        "prices:\n"
        "  alpha/davinci-002: {prompt_per_1m: 1000, completion_per_1m: 2000}\n"
        "  beta/davinci-002: {prompt_per_1m: 3000, completion_per_1m: 4000}\n"
        f"providers:\n  alpha: {{kind: openai, api_key: sk-a, base_url: '{faults['alpha'].base_url}'}}\n"
        f"  beta: {{kind: openai, api_key: sk-b, base_url: '{faults['beta'].base_url}'}}\n"
        "models:\n  - name: smart\n    strategy: ordered\n    hedge_after_ms: 100\n"
        "    targets: [{model: alpha/davinci-002}, {model: beta/davinci-002}]\n"
    )


def day_books(url: str) -> dict[str, Any]:
    with httpx.Client(base_url=url, trust_env=False, timeout=10, headers={"authorization": f"Bearer {ADMIN}"}) as c:
        got = c.get("/admin/usage")
        assert got.status_code == 200, got.text
        books: dict[str, Any] = got.json()["keys"]["ci"]
        return books


def by_target(url: str) -> dict[str, tuple[int, int, int, float]]:
    with httpx.Client(base_url=url, trust_env=False, timeout=10, headers={"authorization": f"Bearer {ADMIN}"}) as c:
        got = c.get("/admin/usage", params={"by": "target"})
        assert got.status_code == 200, got.text
    return {
        r["target"]: (r["requests"], r["prompt_tokens"], r["completion_tokens"], round(r["cost"] * PICO))
        for r in got.json()["rows"]
    }


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Read the ledger as an operator would, with the engine's own client library."""
    if url.startswith("sqlite:///"):
        with opened(url[len("sqlite:///") :], timeout=10) as conn:
            return [tuple(r) for r in conn.execute(sql).fetchall()]
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


def rows(url: str) -> list[tuple[Any, ...]]:
    """Today's ledger rows: target, status, error, tokens, cost, attempts, key and team."""
    sql = (
        "SELECT target, status, error, prompt_tokens, completion_tokens, cost_pico, attempts, key_name, team"
        f" FROM requests WHERE day = '{day_of(time.time())}' ORDER BY target"
    )
    return query(url, sql)


def rolled(url: str) -> list[tuple[Any, ...]]:
    sql = "SELECT target, requests, errors, prompt_tokens, completion_tokens, cost_pico FROM daily ORDER BY target"
    return query(url, sql)


@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
@pytest.mark.parametrize("ledger", ["", "sqlite", "postgres"], ids=["usage-store", "sqlite", "postgres"])
def test_the_loser_of_a_hedge_is_booked_at_its_own_target(
    faults: FaultServer, tmp_path: Path, streamed: bool, ledger: str, request: pytest.FixtureRequest
) -> None:
    # alpha takes the prompt and says nothing; beta, hedged after 100 ms, answers.
    faults["alpha"].script(slow(5.0) if not streamed else stream(first_delay=5.0))
    faults["beta"].script(good() if not streamed else stream(usage=(8, 16)))
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    if ledger == "postgres":
        pg: PostgresServer = request.getfixturevalue("pg")
        db = pg.url
    body: dict[str, Any] = {"model": "smart", "prompt": PROMPT, "max_tokens": 16, "stream": streamed}
    if streamed:
        body["stream_options"] = {"include_usage": True}
    with serve_config(tmp_path, config(faults, db if ledger else None)) as gw:
        headers = {"authorization": f"Bearer {KEY}"}
        with httpx.Client(trust_env=False, timeout=10, headers=headers) as c:
            answer = c.post(gw.url + "/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-gateway-model"] == "beta/davinci-002"
        wait_until(lambda: day_books(gw.url)["requests"] == 1, timeout=10)
        books = day_books(gw.url)
        targets = by_target(gw.url) if ledger else None
        with httpx.Client(trust_env=False, timeout=10) as c:
            exposed = c.get(gw.url + "/metrics").text
    assert faults["alpha"].count == faults["beta"].count == 1
    # The tokens counter counts both calls, each at its own provider, as the spend does.
    assert metric(exposed, "gateway_tokens_total", kind="prompt", provider="alpha") == 5
    assert metric(exposed, "gateway_tokens_total", kind="prompt", provider="beta") == 8
    answered = 8 * BETA_PROMPT + 16 * BETA_COMPLETION  # beta's reported usage
    lost = 5 * ALPHA_PROMPT  # alpha's prompt, as estimated: what it generated before the cut is not known
    # One request of the key, with both calls' tokens and cost: the spend a budget reads.
    assert (books["requests"], books["prompt_tokens"], books["completion_tokens"]) == (1, 8 + 5, 16), books
    assert round(books["cost"] * PICO) == answered + lost
    if not ledger:
        return
    # Each call at its own target; the loser counts as no request.
    assert targets == {"alpha/davinci-002": (0, 5, 0, lost), "beta/davinci-002": (1, 8, 16, answered)}
    wait_until(lambda: len(rows(db)) == 2, timeout=10)
    assert rows(db) == [
        ("alpha/davinci-002", 0, "hedge_lost", 5, 0, lost, 1, "ci", "red"),
        ("beta/davinci-002", 200, None, 8, 16, answered, 2, "ci", "red"),
    ]
    assert rolled(db) == [("alpha/davinci-002", 0, 0, 5, 0, lost), ("beta/davinci-002", 1, 0, 8, 16, answered)]


@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_a_client_gone_during_a_hedge_is_booked_every_call_it_started(
    faults: FaultServer, tmp_path: Path, streamed: bool
) -> None:
    faults["alpha"].script(hang())
    faults["beta"].script(hang())
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    body = {"model": "smart", "prompt": PROMPT, "stream": streamed}
    with serve_config(tmp_path, config(faults, db)) as gw:
        headers = {"authorization": f"Bearer {KEY}"}
        with httpx.Client(trust_env=False, timeout=0.6, headers=headers) as c, pytest.raises(httpx.ReadTimeout):
            c.post(gw.url + "/v1/completions", json=body)  # leaves after 0.6 s: both calls are waiting
        wait_until(lambda: day_books(gw.url)["requests"] == 1, timeout=10)
        books = day_books(gw.url)
    assert (faults["alpha"].count, faults["beta"].count) == (1, 1)
    # Both upstreams took the prompt: 5 tokens each, each at its own target's price.
    assert (books["requests"], books["errors"], books["prompt_tokens"]) == (1, 1, 10), books
    assert round(books["cost"] * PICO) == 5 * ALPHA_PROMPT + 5 * BETA_PROMPT
    wait_until(lambda: len(rows(db)) == 2, timeout=10)
    assert rows(db) == [
        ("alpha/davinci-002", 0, "hedge_lost", 5, 0, 5 * ALPHA_PROMPT, 1, "ci", "red"),
        ("beta/davinci-002", 499, "client_closed_request", 5, 0, 5 * BETA_PROMPT, 2, "ci", "red"),
    ]


@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_a_budget_counts_the_loser_of_a_hedge(faults: FaultServer, tmp_path: Path, streamed: bool) -> None:
    # beta's answer costs $0.088 and alpha's cut call $0.005: a $0.09 budget is spent by both, not by one.
    faults["alpha"].script(slow(5.0) if not streamed else stream(first_delay=5.0))
    faults["beta"].script(good() if not streamed else stream(usage=(8, 16)), then=good())
    yaml = config(faults, None).replace("max_cost_per_day: 100", "max_cost_per_day: 0.09")
    body: dict[str, Any] = {"model": "smart", "prompt": PROMPT, "max_tokens": 16, "stream": streamed}
    if streamed:
        body["stream_options"] = {"include_usage": True}
    with serve_config(tmp_path, yaml) as gw:
        with httpx.Client(trust_env=False, timeout=10, headers={"authorization": f"Bearer {KEY}"}) as c:
            assert c.post(gw.url + "/v1/completions", json=body).status_code == 200
            wait_until(lambda: day_books(gw.url)["requests"] == 1, timeout=10)
            again = c.post(gw.url + "/v1/completions", json={**body, "stream": False, "stream_options": None})
    assert again.status_code == 429, again.text
    assert again.json()["error"]["code"] == "budget_exceeded"


@pytest.mark.parametrize("streamed", [False, True], ids=["buffered", "streamed"])
def test_the_losers_target_quota_is_charged_its_prompt(faults: FaultServer, tmp_path: Path, streamed: bool) -> None:
    # alpha's own quota: 30 tokens a day. The hedged request reserves 5 + 16 there; cut, alpha took its 5.
    faults["alpha"].script(slow(5.0) if not streamed else stream(first_delay=5.0), then=good())
    faults["beta"].script(good() if not streamed else stream(usage=(8, 16)))
    yaml = config(faults, None).replace("api_key: sk-a,", "api_key: sk-a, limits: {tpd: 30},")
    body: dict[str, Any] = {"model": "smart", "prompt": PROMPT, "max_tokens": 16, "stream": streamed}
    with serve_config(tmp_path, yaml) as gw:
        with httpx.Client(trust_env=False, timeout=10, headers={"authorization": f"Bearer {KEY}"}) as c:
            assert c.post(gw.url + "/v1/completions", json=body).status_code == 200
            wait_until(lambda: day_books(gw.url)["requests"] == 1, timeout=10)
            time.sleep(0.3)  # token corrections are applied a few milliseconds after the request ends
            # 5 + 21 tokens: room for them only if the cut call had been given back all it reserved.
            direct = {"model": "alpha/davinci-002", "prompt": PROMPT, "max_tokens": 21}
            again = c.post(gw.url + "/v1/completions", json=direct)
            room = c.post(gw.url + "/v1/completions", json={**direct, "max_tokens": 20})
    assert again.status_code == 429, again.text
    assert room.status_code == 200, room.text
