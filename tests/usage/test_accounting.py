"""Booking and cost arithmetic (gateway/limits/usage.py): prices, picodollar sums, days, budgets, Redis, its outage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.config import ConfigError, PriceConfig, load_config, parse_config
from gateway.limits.auth import KeyRing, fingerprint
from gateway.limits.budgets import usage_budgets
from gateway.limits.prices import Prices
from gateway.limits.usage import ANONYMOUS, PICO, UsageStore, day_of, to_midnight
from gateway.ops.metrics import Metrics, ModelLabels, Record
from gateway.ops.reload import Reloader
from gateway.path.pipeline import Pipeline
from gateway.path.routing import Router
from gateway.state import SharedState
from tests.helpers.redis import RedisServer
from wire.errors import RateLimitError
from wire.schema import CompletionRequest, Usage

# 2023-11-14T22:13:20Z: 6400 s before midnight UTC.
T0 = 1_700_000_000.0
DAY0 = "2023-11-14"

CONFIG = """
keys:
  - {name: team, key: k-team, max_cost_per_day: 0.05}
  - {name: free, key: k-free}
  - {name: frozen, key: k-frozen, max_cost_per_day: 0}
prices:
  demo/long: {prompt_per_1m: 1000, completion_per_1m: 2000}
  fast: {prompt_per_1m: 10, completion_per_1m: 20}
  "demo/*": {prompt_per_1m: 100, completion_per_1m: 100}
  "*": {prompt_per_1m: 1}
providers:
  demo: {kind: fake, models: [text]}
models:
  - {name: fast, targets: [{model: demo/text}]}
"""


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def ident(key: str) -> str:
    """The identity CONFIG's key `key` is booked under (its secret is `k-<name>`)."""
    return fingerprint(f"k-{key}".encode())


def rec(key: str | None, model: str, target: str, prompt: int | None, completion: int = 0) -> Record:
    usage = None if prompt is None else Usage(prompt, completion, prompt + completion)
    provider = target.partition("/")[0]
    return Record(
        request_id="r",
        dialect="openai",
        key=key,
        key_id=ident(key) if key is not None else "",
        model=model,
        provider=provider,
        target=target,
        usage=usage,
    )


async def admit(s: UsageStore, key: str) -> None:
    """A request of key `key` admitted by the budgets (its reservation given back at once, as by a request no
    target served), or their 429 `budget_exceeded` (RateLimitError)."""
    loaded = parse_config(CONFIG, env={})
    found = KeyRing(loaded).authenticate({"authorization": f"Bearer k-{key}"})
    assert found is not None
    budgets = usage_budgets(loaded, s)
    if not budgets.applies(found):
        return
    req = CompletionRequest(model="demo/text", prompt="x", max_tokens=1)
    hold = await budgets.reserve(found, req, Router(loaded).plan("demo/text"), s.prices, s.shared)
    hold.settle(Record(request_id="r", dialect="openai"))
    await asyncio.gather(*s.counters.background)


def store(redis_url: str = "", clock: Clock | None = None, metrics: Metrics | None = None) -> UsageStore:
    loaded = parse_config(CONFIG.replace("keys:", f'redis: {{url: "{redis_url}"}}\nkeys:'), env={})
    clock = clock or Clock()
    # The shared state gets the same clock, so an outage test can move past its one-second retry pause.
    return UsageStore(loaded, SharedState(redis_url, clock=clock), metrics=metrics, clock=clock)


def test_prices_exact_target_then_exact_model_then_globs_in_order() -> None:
    prices = Prices(
        {
            "demo/long": PriceConfig(1, 1),
            "fast": PriceConfig(2, 2),
            "demo/*": PriceConfig(3, 3),
            "*": PriceConfig(4, 4),
        }
    )
    assert prices.find("demo/long", "demo/long") == PriceConfig(1, 1)
    assert prices.find("demo/long", "fast") == PriceConfig(1, 1)  # the served target's exact price wins
    assert prices.find("demo/text", "fast") == PriceConfig(2, 2)  # then the alias's exact price
    assert prices.find("demo/text", "demo/text") == PriceConfig(3, 3)  # then globs, in config order
    assert prices.find("openai/x", "smart") == PriceConfig(4, 4)
    assert Prices({"demo/*": PriceConfig(3, 3)}).find("openai/x", "openai/x") is None


def test_cost_is_tokens_times_price_in_exact_picodollars() -> None:
    prices = Prices({"m/a": PriceConfig(prompt_per_1m=1000, completion_per_1m=2000), "m/b": PriceConfig(0.15, 0.6)})
    assert prices.cost_pico("m/a", "m/a", 3, 7) == 17 * 10**9  # $0.017
    assert prices.cost_pico("m/b", "m/b", 1_000_000, 1_000_000) == round(0.75 * PICO)
    assert prices.cost_pico("m/b", "m/b", 1, 0) == 150_000  # $0.00000015: no float dust
    assert prices.cost_pico("x/y", "x/y", 10, 10) == 0  # unpriced
    # Ten thousand bookings of $0.00000015 sum to exactly $0.0015 (a float running sum drifts).
    assert sum(prices.cost_pico("m/b", "m/b", 1, 0) for _ in range(10_000)) == round(0.0015 * PICO)


def test_days_are_utc_and_retry_after_runs_to_midnight() -> None:
    assert day_of(T0) == DAY0
    assert to_midnight(T0) == 6400
    assert to_midnight(T0 + 6399.2) == 1
    assert day_of(T0 + 6400) == "2023-11-15"
    assert to_midnight(T0 + 6400) == 86_400


async def test_booking_in_process_counts_requests_tokens_and_cost() -> None:
    clock = Clock()
    metrics = Metrics()
    s = store(clock=clock, metrics=metrics)
    s.book(rec("team", "demo/long", "demo/long", 3, 7))
    s.book(rec("team", "demo/long", "demo/long", 3, 7))
    s.book(rec("team", "fast", "demo/text", 5, 10))  # alias: priced by its own exact entry
    s.book(rec("free", "demo/text", "demo/text", None))  # no usage reported: counted, 0 tokens
    s.book(rec(None, "demo/long", "demo/long", 1, 1))  # open gateway
    s.book(Record(request_id="r", dialect="openai", key="team", model="demo/long"))  # nothing served: not booked
    report = await s.report(DAY0)
    team = report.keys["team"]
    assert (team.requests, team.prompt_tokens, team.completion_tokens) == (3, 11, 24)
    assert team.cost == (2 * 17 * 10**9 + (5 * 10 + 10 * 20) * 10**6) / PICO
    assert team.budget == 0.05
    assert team.by_model["demo/long"].requests == 2
    assert team.by_model["demo/long"].cost == 0.034
    assert team.by_model["fast"].prompt_tokens == 5
    free = report.keys["free"]
    assert (free.requests, free.prompt_tokens, free.completion_tokens, free.cost) == (1, 0, 0, 0.0)
    assert report.keys[ANONYMOUS].cost == 0.003
    assert report.keys["frozen"].requests == 0  # configured keys are listed even when unused
    sample = metrics.registry.get_sample_value
    assert sample("gateway_cost_usd_total", {"model": "demo/long", "key": "team"}) == pytest.approx(0.034)
    assert sample("gateway_cost_usd_total", {"model": "fast", "key": "team"}) == pytest.approx(0.00025)
    # A new UTC day starts from zero; the old one is still reported.
    clock.now = T0 + 6400
    s.book(rec("team", "demo/long", "demo/long", 3, 7))
    assert (await s.report("2023-11-15")).keys["team"].requests == 1
    assert (await s.report(DAY0)).keys["team"].requests == 3


async def test_budget_refuses_at_or_over_todays_spend_until_midnight() -> None:
    clock = Clock()
    s = store(clock=clock)
    for _ in range(2):
        s.book(rec("team", "demo/long", "demo/long", 3, 7))
    await admit(s, "team")  # $0.034 < $0.05
    await admit(s, "free")  # no budget
    s.book(rec("team", "demo/long", "demo/long", 3, 7))
    with pytest.raises(RateLimitError) as caught:
        await admit(s, "team")  # $0.051 >= $0.05
    err = caught.value
    assert (err.status, err.type, err.code) == (429, "rate_limit_error", "budget_exceeded")
    assert err.retry_after == 6400
    assert "Key 'team'" in err.message and "$0.05 " in err.message and "$0.051 spent" in err.message
    with pytest.raises(RateLimitError):
        await admit(s, "frozen")  # a budget of 0 blocks the key
    clock.now = T0 + 6400  # next UTC day
    await admit(s, "team")


async def test_adopt_keeps_in_process_bookings_across_a_reload() -> None:
    old = store()
    old.book(rec("team", "demo/long", "demo/long", 3, 7))
    new = store()
    new.book(rec("team", "demo/long", "demo/long", 3, 7))
    new.adopt(old)
    old.book(rec("team", "demo/long", "demo/long", 3, 7))  # a request that finished on the old config
    assert (await new.report(DAY0)).keys["team"].requests == 3
    with pytest.raises(RateLimitError):
        await admit(new, "team")


@pytest.fixture
async def redis_store(rds: RedisServer) -> AsyncIterator[tuple[UsageStore, Clock]]:
    clock = Clock()
    s = store(rds.url, clock)
    try:
        yield s, clock
    finally:
        await s.shared.close()


async def test_redis_booking_is_one_hash_per_key_and_day(
    redis_store: tuple[UsageStore, Clock], rds: RedisServer
) -> None:
    s, _ = redis_store
    s.book(rec("team", "demo/long", "demo/long", 3, 7))
    s.book(rec("team", "fast", "demo/text", 5, 10))
    await s.drain()
    with rds.client() as r:
        # Stored under the key's identity, never its name; the day's index names it.
        fields = r.hgetall(f"usage:{DAY0}:{ident('team')}")
        assert not r.exists(f"usage:{DAY0}:team")
        assert r.hgetall(f"usage-keys:{DAY0}") == {ident("team"): "team"}
        ttl = r.ttl(f"usage:{DAY0}:{ident('team')}")
    assert fields == {
        "requests:demo/long": "1",
        "prompt_tokens:demo/long": "3",
        "completion_tokens:demo/long": "7",
        "cost_pico:demo/long": str(17 * 10**9),
        "requests:fast": "1",
        "prompt_tokens:fast": "5",
        "completion_tokens:fast": "10",
        "cost_pico:fast": str(250 * 10**6),
        "cost_pico": str(17 * 10**9 + 250 * 10**6),
    }
    assert 39 * 86_400 < ttl <= 40 * 86_400
    assert s.local == {}
    assert await s.spent_pico(ident("team"), DAY0) == 17 * 10**9 + 250 * 10**6


async def test_redis_outage_books_locally_and_flushes_when_it_returns(
    redis_store: tuple[UsageStore, Clock], rds: RedisServer
) -> None:
    s, clock = redis_store
    s.book(rec("team", "demo/long", "demo/long", 3, 7))
    await s.drain()
    rds.stop()
    try:
        s.book(rec("team", "demo/long", "demo/long", 3, 7))
        await s.drain()
        assert s.shared.degraded
        assert s.local[(DAY0, ident("team"))]["requests:demo/long"] == 1  # kept in process, not lost
        s.book(rec("team", "demo/long", "demo/long", 3, 7))
        s.book(rec("team", "demo/long", "demo/long", 3, 7))
        await s.drain()
        # While Redis is away a budget sees only what this process booked meanwhile: here $0.051, over $0.05.
        assert await s.spent_pico(ident("team"), DAY0) == 3 * 17 * 10**9
        with pytest.raises(RateLimitError):
            await admit(s, "team")
    finally:
        rds.start()
    clock.now += 1.5  # past the shared state's retry pause: the next call tries Redis again
    s.book(rec("free", "demo/text", "demo/text", 1, 1))
    await s.drain()
    assert s.local == {}
    # The restarted redis-server (no persistence) forgot the booking made before the outage; the three booked
    # during it went along with the next booking that reached Redis.
    with rds.client() as r:
        assert r.hget(f"usage:{DAY0}:{ident('team')}", "requests:demo/long") == "3"
        assert r.hget(f"usage:{DAY0}:{ident('free')}", "requests:demo/text") == "1"
    report = await s.report(DAY0)
    assert report.keys["team"].requests == 3
    assert report.keys["team"].cost == 0.051


@pytest.mark.parametrize(
    ("yaml", "error"),
    [
        ('prices: {"demo/*": {prompt_per_1m: 1, cached_per_1m: 2}}', "prices.demo/*.cached_per_1m: unknown key"),
        ("prices: {demo/long: {completion_per_1m: -1}}", "prices.demo/long.completion_per_1m: Expected `float` >= 0.0"),
        ("prices: {demo/long: 3}", "prices.demo/long: Expected `object`, got `int`"),
        ("keys: [{name: a, key: b, max_cost_per_day: -0.5}]", "keys[0].max_cost_per_day: Expected `float` >= 0.0"),
        ("admin: {token: x}", "admin.token: unknown key"),
    ],
)
def test_the_new_config_keys_are_typed(yaml: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("providers: {demo: {kind: fake}}\n" + yaml, "c.yaml", env={})
    assert str(caught.value).startswith(f"c.yaml: {error}")


def test_config_defaults_and_values() -> None:
    loaded = parse_config(CONFIG + 'admin: {key: "${ADMIN_KEY}"}\n', env={"ADMIN_KEY": "s3cret"})
    cfg = loaded.config
    assert cfg.admin.key == "s3cret"
    assert cfg.prices["demo/long"] == PriceConfig(prompt_per_1m=1000.0, completion_per_1m=2000.0)
    assert cfg.prices["*"] == PriceConfig(prompt_per_1m=1.0, completion_per_1m=0.0)
    assert [k.max_cost_per_day for k in cfg.keys] == [0.05, None, 0.0]
    bare = parse_config("providers: {demo: {kind: fake}}", env={}).config
    assert (bare.admin.key, bare.prices) == ("", {})


async def test_a_config_reload_keeps_in_process_usage_and_budgets(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    state = SimpleNamespace(pipeline=Pipeline(load_config(path)))
    reloader = Reloader(state, str(path), lambda loaded: Pipeline(loaded))
    old: Pipeline = state.pipeline
    for _ in range(3):
        old.usage.book(rec("team", "demo/long", "demo/long", 3, 7))
    path.write_text(CONFIG.replace("max_cost_per_day: 0.05", "max_cost_per_day: 0.06"))
    assert await reloader.reload("test")
    new: Pipeline = state.pipeline
    try:
        assert new is not old
        assert new.usage.budgets["team"] == 0.06
        assert (await new.usage.report(new.usage.today())).keys["team"].cost == 0.051
        old.usage.book(rec("team", "demo/long", "demo/long", 3, 7))  # finished on the old config
        with pytest.raises(RateLimitError):
            await admit(new.usage, "team")  # $0.068 >= $0.06
    finally:
        await old.close()
        await new.close()


LABELS = """
keys:
  - {name: a, key: k-a, models: ["openai/*", "openai/gpt-exact", "smart"]}
teams: {blue: {models: ["openai/team-exact", "openai/team-*"]}}
prices:
  "openai/priced": {prompt_per_1m: 1}
  "openai/glob-*": {prompt_per_1m: 1}
providers:
  openai: {kind: openai, api_key: k, models: [gpt-4o]}
  azure:
    kind: azure
    api_key: k
    base_url: http://127.0.0.1:1
    models: [gpt-4o]
    deployments: {east: {}}
models:
  - name: smart
    targets: [{model: openai/target}]
    fallbacks: [openai/fallback]
    context_window_fallbacks: [azure/big]
"""


@pytest.mark.parametrize(
    ("model", "label"),
    [
        ("smart", "smart"),  # an alias
        ("openai/target", "openai/target"),  # what an alias routes to
        ("openai/fallback", "openai/fallback"),
        ("azure/big", "azure/big"),
        ("openai/gpt-4o", "openai/gpt-4o"),  # declared under the provider's models
        ("openai/priced", "openai/priced"),  # an exact price key
        ("openai/gpt-exact", "openai/gpt-exact"),  # an exact entry of a key's models
        ("openai/team-exact", "openai/team-exact"),  # and of a team's
        ("openai/team-x", "openai/other"),
        ("openai/glob-x", "openai/other"),  # globs name no label
        ("openai/anything/else", "openai/other"),
        ("azure/gpt-4o/east", "azure/gpt-4o/east"),  # a declared model on a declared deployment
        ("azure/random/east", "azure/other/east"),
        ("azure/random/west", "azure/other"),
        ("nope/x", "unknown"),
        ("unknown", "unknown"),
        ("openai/", "unknown"),
    ],
)
def test_model_labels_keep_config_names_and_fold_the_rest(model: str, label: str) -> None:
    labels = ModelLabels(parse_config(LABELS, env={}))
    assert labels.fold(model) == label


def test_model_labels_without_a_config_fold_everything() -> None:
    assert ModelLabels().fold("demo/text") == "unknown"
    metrics = Metrics()
    metrics.observe(Record(request_id="r", dialect="openai", model="demo/x", provider="demo"), 0.01)
    metrics.tally.flush()  # what every render does first: counts are added to their series in batches
    assert (
        metrics.registry.get_sample_value(
            "gateway_requests_total",
            {"endpoint": "completions", "dialect": "openai", "model": "unknown", "provider": "demo", "status": "200"},
        )
        == 1
    )


async def test_undeclared_models_are_booked_under_their_providers_bucket_at_their_own_price() -> None:
    metrics = Metrics()
    s = store(metrics=metrics)
    s.book(rec("team", "demo/long", "demo/long", 3, 7))
    s.book(rec("team", "demo/x1", "demo/x1", 3, 7))
    s.book(rec("team", "demo/x2", "demo/x2", 3, 7))
    team = (await s.report(DAY0)).keys["team"]
    assert set(team.by_model) == {"demo/long", "demo/other"}
    assert team.by_model["demo/other"].requests == 2
    assert team.by_model["demo/other"].cost == pytest.approx(2 * 10 * 100 / 1e6)  # demo/*: $100/1M
    labels = {s.labels["model"] for m in metrics.registry.collect() for s in m.samples if "model" in s.labels}
    assert labels == {"demo/long", "demo/other"}


def test_price_cache_keeps_no_long_client_strings() -> None:
    prices = Prices({"demo/*": PriceConfig(1, 1)})
    long_name = "demo/" + "x" * 10_000
    assert prices.find(long_name, long_name) == PriceConfig(1, 1)
    assert prices.find("demo/a", "demo/a") == PriceConfig(1, 1)
    assert list(prices._cache) == [("demo/a", "demo/a")]


@pytest.mark.parametrize("outage", ["paused", "restarted"])
async def test_a_reservation_redis_could_not_take_back_is_given_back_when_it_returns(
    redis_store: tuple[UsageStore, Clock], rds: RedisServer, outage: str
) -> None:
    """A request reserved in Redis ends while Redis does not answer: its reservation is owed, and given back
    with the counter's next reservation, so the outage leaves none behind to refuse the key for the rest of
    the day. A Redis that restarted empty lost the reservation with the counter: nothing is taken from the
    new counter's (another request's) reservations."""
    s, clock = redis_store
    loaded = parse_config(CONFIG, env={})
    key = KeyRing(loaded).authenticate({"authorization": "Bearer k-team"})
    assert key is not None
    budgets = usage_budgets(loaded, s)
    req = CompletionRequest(model="demo/text", prompt="x", max_tokens=1)
    plan = Router(loaded).plan("demo/text")
    worst = budgets.worst_case(req, plan, s.prices)[0]
    counter = f"budget:key_id:{ident('team')}:{DAY0}"

    def reserved() -> int:
        with rds.client() as r:
            return int(r.hget(counter, "reserved") or 0)

    hold = await budgets.reserve(key, req, plan, s.prices, s.shared)
    assert reserved() == worst
    if outage == "paused":
        with rds.client() as r:
            r.execute_command("CLIENT", "PAUSE", 1500, "ALL")  # no answers for 1.5 s; the data stays
    else:
        rds.stop()
    try:
        hold.settle(Record(request_id="r", dialect="openai"))  # nothing served: the reservation goes back
        await asyncio.gather(*s.counters.background)
        assert counter in s.counters.owed
    finally:
        if outage == "paused":
            await asyncio.sleep(1.6)
        else:
            rds.start()
    clock.now += 1.5  # past the shared state's retry pause
    again = await budgets.reserve(key, req, plan, s.prices, s.shared)
    assert reserved() == worst  # this request's alone
    assert s.counters.owed == {}
    again.settle(Record(request_id="r", dialect="openai"))
    await asyncio.gather(*s.counters.background)
    assert reserved() == 0
