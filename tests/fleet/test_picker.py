"""The replica policies as pure functions (the socket tests are next door)."""

from __future__ import annotations

from collections import Counter

from gateway.config import ReplicaConfig, RoutingConfig
from gateway.fleet.affinity import Ring, prefix_key, session_key
from gateway.fleet.picker import EngineLoad, Fleet, Hint
from gateway.fleet.tenancy import owner_of
from wire.schema import CompletionRequest

URLS = ["http://a:8000/v1", "http://b:8000/v1", "http://c:8000/v1"]
IDLE = [0, 0, 0]
WARM = [False, False, False]


def hint(prompt: str, **headers: str) -> Hint:
    return Hint(CompletionRequest(model="e/m", prompt=prompt), headers)


def test_prefix_keys_follow_the_leading_blocks_of_text_and_of_token_ids() -> None:
    shared = "x" * 1024
    assert prefix_key(shared + "one", 256, 16, 4) == prefix_key(shared + "two", 256, 16, 4)
    assert prefix_key("y" + shared, 256, 16, 4) != prefix_key(shared, 256, 16, 4)
    ids = list(range(64))
    assert prefix_key([*ids, 1], 256, 16, 4) == prefix_key([*ids, 2, 3], 256, 16, 4)
    assert prefix_key([[*ids, 1], [9]], 256, 16, 4) == prefix_key([*ids, 7], 256, 16, 4)  # a batch: its first
    assert prefix_key([5, *ids], 256, 16, 4) != prefix_key(ids, 256, 16, 4)
    assert prefix_key("short", 256, 16, 4) != prefix_key("shorter", 256, 16, 4)  # under one block: all of it


def test_the_ring_is_placed_by_url_not_by_config_order() -> None:
    forward, backward = Ring(URLS, [1, 1, 1]), Ring(URLS[::-1], [1, 1, 1])
    for key in range(0, 2**64, 2**60):
        assert URLS[forward.walk(key)[0]] == URLS[::-1][backward.walk(key)[0]]


def test_a_replica_removed_moves_only_its_own_keys_and_scopes_place_one_id_apart() -> None:
    whole, fewer = Ring(URLS, [1, 1, 1]), Ring(URLS[:2], [1, 1])
    moved = 0
    for n in range(600):
        key = session_key(f"s{n}", owner_of("key:cfg_1")[0])
        home = URLS[whole.walk(key)[0]]
        if home == URLS[2]:
            moved += 1
            continue
        assert URLS[fewer.walk(key)[0]] == home  # nobody else's session moves
    assert 120 < moved < 280
    a, b = owner_of("key:a")[0], owner_of("key:b")[0]
    homes = {whole.walk(session_key(f"s{n}", owner))[0] for n in range(8) for owner in (b"", a, b)}
    assert homes == {0, 1, 2}
    assert [whole.walk(session_key(f"s{n}", a))[0] for n in range(24)] != [
        whole.walk(session_key(f"s{n}", b))[0] for n in range(24)
    ]


def test_round_robin_follows_the_weights_and_skips_draining_and_hot_replicas() -> None:
    fleet = Fleet("e", [URLS[0], URLS[1], ReplicaConfig(url=URLS[2], weight=2)], None)
    assert Counter(fleet.choose(IDLE, WARM, None)[0] for _ in range(400)) == {0: 100, 1: 100, 2: 200}
    fleet.draining[1] = True
    assert all(1 not in fleet.choose(IDLE, WARM, None) for _ in range(10))
    fleet.store(2, EngineLoad(waiting=50, running=4), None)
    assert all(fleet.choose(IDLE, WARM, None) == [0, 2] for _ in range(10))  # hot: last
    fleet.draining = [True, True, True]
    assert fleet.choose(IDLE, WARM, None) == []


def test_prefix_goes_home_until_the_home_is_over_the_bound_cooling_or_draining() -> None:
    fleet = Fleet("e", URLS, RoutingConfig(policy="prefix", epsilon=0.25))
    h = hint("p" * 2000)
    home, nxt, last = fleet.choose(IDLE, WARM, h)
    assert fleet.choose([5, 5, 5], WARM, h)[0] == home  # equal loads: under the bound
    busy = [0, 0, 0]
    busy[home] = 3  # ceil(1.25 x 4 / 3) = 2: over
    assert fleet.choose(busy, WARM, h)[0] == nxt
    cooling = [i == home for i in range(3)]
    assert fleet.choose(IDLE, cooling, h)[0] == nxt
    fleet.draining[home] = True
    assert fleet.choose(IDLE, WARM, h) == [nxt, last]


def test_sessions_stick_and_without_one_go_to_the_least_loaded() -> None:
    fleet = Fleet("e", URLS, RoutingConfig(policy="session"))
    homes = {fleet.choose(IDLE, WARM, hint("q", **{"x-session-id": "s1"}))[0] for _ in range(10)}
    assert len(homes) == 1
    assert fleet.choose([3, 0, 3], WARM, hint("q"))[0] == 1


def test_least_outstanding_counts_the_engine_queue() -> None:
    fleet = Fleet("e", URLS, RoutingConfig(policy="least_outstanding"))
    fleet.store(1, EngineLoad(waiting=4, running=2), None)
    assert fleet.choose([1, 0, 2], WARM, None)[0] == 0


def test_a_prefix_spreads_to_its_ring_neighbour_when_that_is_clearly_idler_but_a_session_stays() -> None:
    for routing, moves in ((RoutingConfig(policy="prefix"), True), (RoutingConfig(policy="session"), False)):
        fleet = Fleet("e", URLS, routing)
        h = hint("p" * 2000, **{"x-session-id": "s"})
        home, nxt, last = fleet.choose(IDLE, WARM, h)
        loads = [0, 0, 0]
        loads[home], loads[last] = 2, 3  # home under ceil(1.25 x 6 / 3) = 3, its neighbour two fewer
        assert fleet.choose(loads, WARM, h)[0] == (nxt if moves else home)
        loads[home] = 1  # one fewer only: home
        assert fleet.choose(loads, WARM, h)[0] == home
