"""Client keys: Bearer or x-api-key, 401 for a wrong or missing key, model patterns, disabled keys."""

from __future__ import annotations

import hashlib
import time

import msgspec
import pytest

from gateway.config import parse_config
from gateway.limits.auth import ClientKey, KeyRing, RuntimeKeys
from gateway.limits.globs import ModelGlobs
from wire.errors import AuthenticationError, PermissionDeniedError

CONFIG = """
keys:
  - {name: full, key: "${FULL_KEY}"}
  - {name: limited, key: "${LIMITED_KEY}", models: ["openai/*", "fireworks/**", "fast"]}
  - {name: ghost, key: "${GHOST_KEY}"}
  - {name: none, key: "k-none", models: []}
"""
ENV = {"FULL_KEY": "gk-full-123", "LIMITED_KEY": "gk-limited-456"}


def ring(env: dict[str, str] | None = None, text: str = CONFIG) -> KeyRing:
    return KeyRing(parse_config(text, env=ENV if env is None else env))


def unauthenticated(headers: dict[str, str]) -> AuthenticationError:
    with pytest.raises(AuthenticationError) as info:
        ring().authenticate(headers)
    assert (info.value.status, info.value.type) == (401, "authentication_error")
    return info.value


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": "Bearer gk-full-123"},
        {"authorization": "bearer gk-full-123"},
        {"authorization": "Bearer   gk-full-123  "},
        {"x-api-key": "gk-full-123"},
        {"authorization": "Basic Zm9v", "x-api-key": "gk-full-123"},
        {"authorization": "Bearer ", "x-api-key": "gk-full-123"},
    ],
)
def test_bearer_and_x_api_key(headers: dict[str, str]) -> None:
    key = ring().authenticate(headers)
    assert key is not None and key.name == "full"


def test_bearer_wins_over_x_api_key() -> None:
    key = ring().authenticate({"authorization": "Bearer gk-limited-456", "x-api-key": "gk-full-123"})
    assert key is not None and key.name == "limited"


@pytest.mark.parametrize(
    "headers",
    [{"authorization": "Bearer gk-full-12"}, {"authorization": "Bearer gk-full-1234"}, {"x-api-key": "nope"}],
)
def test_wrong_key(headers: dict[str, str]) -> None:
    err = unauthenticated(headers)
    assert (err.code, err.message) == ("invalid_api_key", "Incorrect API key provided")


@pytest.mark.parametrize(
    "headers", [{}, {"authorization": "Basic Zm9v"}, {"authorization": "Bearer"}, {"x-api-key": ""}]
)
def test_missing_key(headers: dict[str, str]) -> None:
    err = unauthenticated(headers)
    assert err.code == "missing_api_key"
    assert err.message == "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"


def test_model_patterns() -> None:
    keys = ring()
    limited = keys.authenticate({"x-api-key": "gk-limited-456"})
    # `*` stops at `/`; `**` crosses it.
    for model in ("openai/gpt-3.5-turbo-instruct", "fireworks/accounts/fireworks/models/x", "fast"):
        KeyRing.authorize(limited, model)
    for model in ("openai/a/b", "together/x", "fast2", "openai", "xopenai/y", "FAST", "fireworks"):
        with pytest.raises(PermissionDeniedError) as info:
            KeyRing.authorize(limited, model)
        err = info.value
        assert (err.status, err.param, err.code) == (403, "model", "model_not_allowed")
        assert err.message == f"Key 'limited' may not use model '{model}'"
    full = keys.authenticate({"x-api-key": "gk-full-123"})
    KeyRing.authorize(full, "anything/at-all/east")


def test_key_with_no_patterns_may_use_nothing() -> None:
    none = ring().authenticate({"x-api-key": "k-none"})
    with pytest.raises(PermissionDeniedError):
        KeyRing.authorize(none, "demo/text")


def test_disabled_key_does_not_open_the_gateway() -> None:
    keys = ring({})
    assert keys.disabled == ["full", "limited", "ghost"]
    assert keys.open is False
    with pytest.raises(AuthenticationError):
        keys.authenticate({"authorization": "Bearer "})
    # The unset variable interpolates to "": an empty presented key is "missing", never a match.
    with pytest.raises(AuthenticationError):
        keys.authenticate({"x-api-key": "${GHOST_KEY}"})
    assert keys.authenticate({"x-api-key": "k-none"}) is not None


def test_all_keys_disabled_still_closed() -> None:
    keys = ring({}, 'keys: [{name: only, key: "${ONLY_KEY}"}]')
    assert keys.disabled == ["only"] and keys.open is False
    with pytest.raises(AuthenticationError):
        keys.authenticate({"authorization": "Bearer anything"})


def test_no_keys_is_open() -> None:
    keys = ring({}, "keys: []")
    assert keys.open is True
    assert keys.authenticate({}) is None
    KeyRing.authorize(None, "any/model")


def test_a_key_seen_again_is_checked_against_the_keys_in_force() -> None:
    keys = ring()
    secret = "rk-runtime-789"
    digest = hashlib.sha256(secret.encode()).digest()
    runtime = RuntimeKeys()
    runtime.by_digest = {digest: ClientKey("rt", b"", ModelGlobs(["*"]), digest, ident="key_rt")}
    keys.runtime = runtime
    for _ in range(3):  # the second and third by the remembered digest
        for bearer, name in ((secret, "rt"), ("gk-full-123", "full")):
            key = keys.authenticate({"authorization": f"Bearer {bearer}"})
            assert key is not None and key.name == name
    # Expired since it was remembered: refused as expired, not let in by the remembered digest.
    gone = ClientKey("rt", b"", ModelGlobs(["*"]), digest, ident="key_rt", valid_until=time.time() - 1)
    runtime.by_digest = {digest: gone}
    with pytest.raises(AuthenticationError, match="expired"):
        keys.authenticate({"authorization": f"Bearer {secret}"})
    runtime.by_digest = {}  # revoked
    with pytest.raises(AuthenticationError, match="Incorrect"):
        keys.authenticate({"authorization": f"Bearer {secret}"})
    assert secret not in keys._known  # no revoked key's secret is kept
    assert keys.authenticate({"authorization": "Bearer gk-full-123"}) is not None


def test_wrong_keys_are_never_remembered() -> None:
    keys = ring()
    for i in range(3000):
        with pytest.raises(AuthenticationError):
            keys.authenticate({"authorization": f"Bearer gk-wrong-{i}"})
    for i in range(3000):
        with pytest.raises(AuthenticationError):
            keys.authenticate({"x-api-key": f"gk-wrong-{i}"})
    assert keys._known == {}
    for _ in range(2):  # the second by the remembered digest
        assert keys.authenticate({"x-api-key": "gk-limited-456"}).name == "limited"  # type: ignore[union-attr]
    assert list(keys._known) == ["gk-limited-456"]
    # A key sent as x-api-key beside an Authorization value that is not a bearer key: that key is what counts.
    assert keys.authenticate({"authorization": "Basic Zm9v", "x-api-key": "gk-full-123"}) is not None
    with pytest.raises(AuthenticationError):
        keys.authenticate({"authorization": "Basic Zm9v", "x-api-key": "nope"})
    # Bounded however many distinct keys authenticate.
    secrets = [f"rk-many-{i}" for i in range(3000)]
    runtime = RuntimeKeys()
    digests = [hashlib.sha256(secret.encode()).digest() for secret in secrets]
    runtime.by_digest = {
        d: ClientKey(f"k{i}", b"", ModelGlobs(["*"]), d, ident=f"key_{i}") for i, d in enumerate(digests)
    }
    keys.runtime = runtime
    for secret in secrets:
        assert keys.authenticate({"authorization": f"Bearer {secret}"}) is not None
    assert 0 < len(keys._known) <= 1024


def test_runtime_keys_are_held_to_their_teams_models_of_the_ring_in_force() -> None:
    text = CONFIG + "teams: {blue: {models: [fast]}, green: {}}\n"
    secret, other = "rk-blue-1", "rk-stray-2"
    digest, stray = (hashlib.sha256(s.encode()).digest() for s in (secret, other))
    runtime = RuntimeKeys()
    every = ModelGlobs(["**"])
    runtime.by_digest = {
        digest: ClientKey("b1", b"", every, digest, ident="key_b1", team="blue"),
        stray: ClientKey("s1", b"", every, stray, ident="key_s1", team="gone"),  # a team no longer declared
    }
    keys = ring(text=text)
    keys.runtime = runtime
    key = keys.authenticate({"authorization": f"Bearer {secret}"})
    assert key is not None and key.models.match("fast") and not key.models.match("openai/x")
    with pytest.raises(PermissionDeniedError, match=r"Key 'b1' may not use model 'openai/x' \(team 'blue' may not\)"):
        KeyRing.authorize(key, "openai/x")
    assert keys.authenticate({"authorization": f"Bearer {secret}"}) is key  # bound once per table, not per request
    assert keys.identified("key_b1") is key  # a batch's lines run as the bound key
    assert every.match("openai/x")  # the ledger's own key is untouched
    # A key whose team this config does not declare is refused, not let through without its team's ceiling.
    with pytest.raises(PermissionDeniedError) as info:
        keys.authenticate({"authorization": f"Bearer {other}"})
    assert (info.value.status, info.value.code, info.value.param) == (403, "team_undeclared", None)
    assert info.value.message == (
        "Key 's1' is of team 'gone', which the gateway's config does not declare: "
        "the key is refused until its team is declared again"
    )
    assert keys.identified("key_s1") is None and keys.stray("key_s1") is runtime.by_digest[stray]
    assert keys.stray("key_b1") is None and keys.name_of("key_s1") == "gone/s1"  # the operator's name of it
    assert keys.name_of("key_s1", "gone") == "s1"  # its team's admin's
    with pytest.raises(AuthenticationError, match="Incorrect API key"):  # a wrong key is told nothing more
        keys.authenticate({"authorization": "Bearer rk-stray-3"})
    # A config that declares its team lets it in (a reload that declares the team again).
    declared = ring(text=text.replace("green: {}", "gone: {}"))
    declared.runtime = runtime
    assert declared.authenticate({"authorization": f"Bearer {other}"}) is not None
    assert declared.stray("key_s1") is None and declared.identified("key_s1") is not None
    # A new table (a key changed) is bound again; another config's ring (a reload) binds by its own teams.
    runtime.by_digest = dict(runtime.by_digest)
    again = keys.authenticate({"authorization": f"Bearer {secret}"})
    assert again is not None and again is not key and not again.models.match("openai/x")
    wider = ring(text=CONFIG + "teams: {blue: {}}\n")
    wider.runtime = runtime
    assert wider.authenticate({"authorization": f"Bearer {secret}"}).models.match("openai/x")  # type: ignore[union-attr]
    # With no team ceiling at all, a stray key is still refused; one expired is told that first.
    runtime.by_digest = {**runtime.by_digest, stray: msgspec.structs.replace(runtime.by_digest[stray], valid_until=1.0)}
    for plain in (ring(text=CONFIG + "teams: {blue: {}}\n"), ring()):
        plain.runtime = runtime
        with pytest.raises(AuthenticationError, match="This API key has expired"):
            plain.authenticate({"authorization": f"Bearer {other}"})
    runtime.by_digest = {
        **runtime.by_digest,
        stray: msgspec.structs.replace(runtime.by_digest[stray], valid_until=None),
    }
    with pytest.raises(PermissionDeniedError, match="team 'gone'"):
        wider.authenticate({"authorization": f"Bearer {other}"})
    # A YAML key of a team: its own patterns within the team's.
    teamed = text.replace('models: ["openai/*", "fireworks/**", "fast"]', 'models: ["**"], team: blue')
    limited = ring(text=teamed).authenticate({"x-api-key": "gk-limited-456"})
    assert limited is not None and limited.models.match("fast") and not limited.models.match("openai/x")


def test_a_keys_label_is_set_when_it_is_built() -> None:
    every = ModelGlobs(["**"])
    runtime = ClientKey("ci", b"", every, b"d", ident="key_1", team="blue")
    assert runtime.label == "blue/ci"
    assert ClientKey("ci", b"", every, b"d", ident="key_2").label == "ci"  # of no team
    # A key built from the config is shown by its name, a team's too (the config's names are one namespace).
    text = CONFIG + '  - {name: ci, key: "k-ci", team: blue}\nteams: {blue: {}}\n'
    yaml = ring(text=text).authenticate({"authorization": "Bearer k-ci"})
    assert yaml is not None and (yaml.team, yaml.label) == ("blue", "ci")
    # A copy of the key (held to its team's models, or its old secret in its grace) is labelled as it is built.
    assert msgspec.structs.replace(runtime, models=ModelGlobs(["fast"])).label == "blue/ci"
    assert msgspec.structs.replace(runtime, team="green").label == "green/ci"
