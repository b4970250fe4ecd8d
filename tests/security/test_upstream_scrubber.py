"""gateway.upstream.scrub on its own: what counts as a secret in a config, what is cut, and that it stays linear."""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import Any

import pytest

from gateway.config import ConfigError, parse_config
from gateway.upstream.scrub import REDACTED, Scrubber, config_secrets, watch_logs

KEY = "sk-live-7Qm2xV9pL4tR8wZ1cB6nH3jK5dF0gS"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (f"Bearer {KEY}", f"Bearer {REDACTED}"),
        (f"key {KEY[:20]}...", f"key {REDACTED}..."),
        (f"sk-live-****{KEY[-4:]} rejected", f"{REDACTED} rejected"),
        (f"sk-...{KEY[-4:]}", REDACTED),
        (f"middle {KEY[10:24]} end", f"middle {REDACTED} end"),
        ("the server is overloaded... retry", "the server is overloaded... retry"),
        ("invalid_upstream_response sk-live", "invalid_upstream_response sk-live"),
    ],
)
def test_what_is_cut(text: str, want: str) -> None:
    assert Scrubber([KEY]).scrub(text) == want


def test_message_is_capped_after_scrubbing() -> None:
    out = Scrubber([KEY], message_chars=100).message("x" * 95 + KEY)
    assert len(out) <= 100 and KEY[:12] not in out


def test_secrets_come_from_every_credential_in_the_config() -> None:
    loaded = parse_config(
        """
providers:
  a:
    kind: openai
    api_key: sk-aaaaaaaaaaaaaaaaaaaaaaaa
    headers: {x-api-token: tok-bbbbbbbbbbbbbbbb, x-team: platform-team}
  b:
    kind: azure
    base_url: "https://host"
    proxy: "http://user:pw-cccccccccccc@proxy:3128"
    api_version: "2024-02-01"
    deployments: {eu: {api_key: az-dddddddddddddddd}}
  c: {kind: bedrock, api_key: "AKIAEEEEEEEEEEEEEEEE:ffffffffffffffffffffffff", region: us-east-1}
keys: [{name: k, key: gk-gggggggggggggggg}]
admin: {key: adm-hhhhhhhhhhhhhhhh}
redis: {url: "redis+sentinel://:redis-iiiiiiiiiiii@s1:26379/gw?sentinel_password=sent-jjjjjjjjjjjj"}
ledger: {url: "postgresql://postgres:pg-kkkkkkkkkkkk@db:5432/gw"}
""",
        "config.yaml",
        env={},
    )
    found = config_secrets(loaded)
    for want in (
        "sk-aaaaaaaaaaaaaaaaaaaaaaaa",
        "tok-bbbbbbbbbbbbbbbb",
        "pw-cccccccccccc",
        "user:pw-cccccccccccc",  # what goes on the wire as Basic auth, encoded
        "az-dddddddddddddddd",
        "AKIAEEEEEEEEEEEEEEEE",
        "ffffffffffffffffffffffff",
        "gk-gggggggggggggggg",
        "adm-hhhhhhhhhhhhhhhh",
        "redis-iiiiiiiiiiii",
        "sent-jjjjjjjjjjjj",
        "pg-kkkkkkkkkkkk",
    ):
        assert want in found
    assert "platform-team" not in found  # not a credential header
    assert "postgres" not in found  # a database's user alone is a word, not a secret


def test_linear_on_hostile_text() -> None:
    scrub = Scrubber([KEY, "another-secret-value-123456"], 1000)
    hostile = ("sk-" + "*" * 5 + KEY[:11] + "..." * 3) * 20_000  # 500 KB of near-misses and mask runs
    started = time.perf_counter()
    out = scrub.scrub(hostile)
    assert time.perf_counter() - started < 3.0
    assert KEY[:11] not in out


def test_log_filter_scrubs_messages_and_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    scrub = Scrubber([KEY])
    watch_logs(scrub)
    caplog.set_level(logging.ERROR, logger="gateway")
    try:
        raise RuntimeError(f"upstream said {KEY}")
    except RuntimeError:
        logging.getLogger("gateway").exception("failed with %s", KEY)
    assert KEY[:12] not in caplog.text and "RuntimeError" in caplog.text


def _escaped(text: str) -> str:
    return "".join(f"\\x{b:02x}" for b in text.encode())


@pytest.mark.parametrize(
    "echo",
    [
        pytest.param(base64.b64encode(KEY.encode()).decode(), id="base64"),
        pytest.param(base64.b64encode(f"Bearer {KEY}".encode()).decode(), id="base64-shifted"),
        pytest.param(base64.b64encode(f"user:{KEY}".encode()).decode(), id="base64-basic"),
        pytest.param(base64.urlsafe_b64encode(f"x{KEY}".encode()).decode().rstrip("="), id="base64-urlsafe"),
        pytest.param(KEY.encode().hex(), id="hex"),
        pytest.param(KEY.encode().hex().upper(), id="hex-upper"),
        pytest.param(_escaped(KEY), id="x-escapes"),
        pytest.param(KEY.upper(), id="upper-cased"),
        pytest.param(" ".join(KEY[i : i + 9] for i in range(0, len(KEY), 9)), id="pieces-of-9"),
    ],
)
def test_re_encoded_keys_are_cut(echo: str) -> None:
    out = Scrubber([KEY]).scrub(f"rejected credential {echo} for this request")
    assert REDACTED in out
    # Nothing of the key survives in any form: 8 characters of it, or 16 of its hex, or 12 of its base64.
    assert echo not in out
    assert not any(KEY[i : i + 8] in out for i in range(len(KEY) - 7) if not KEY[i : i + 8].isalpha())


def test_a_key_split_between_fields_is_cut_from_both() -> None:
    head, tail = KEY[:7], KEY[7:13]  # each under any threshold on its own
    message, param = Scrubber([KEY]).scrub_together(f"bad key {head}", f"{tail}")
    assert head not in message and tail not in param
    assert Scrubber([KEY]).scrub(f"bad key {head}") == f"bad key {head}"  # alone, 7 characters are not a leak


def test_ordinary_text_is_left_alone_by_the_encoded_forms() -> None:
    # Words of a key made of words are not a leak under 12 characters; neither are request ids or hashes.
    scrub = Scrubber(["sk-test-upstream-proxy-key-000"])
    for text in (
        "Upstream 'openai/gpt-4o' timed out; upstream proxy refused",
        "request req_8c1f0e9a2b7d4c5e6f708192 failed",
        "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    ):
        assert scrub.scrub(text) == text


def test_proxy_basic_auth_is_cut_in_its_encoded_form() -> None:
    loaded = parse_config(
        'providers: {a: {kind: openai, api_key: sk-a-key-000000000000, proxy: "http://gw:pr0xy-Pa55w0rd@p:3128"}}',
        "config.yaml",
        env={},
    )
    basic = base64.b64encode(b"gw:pr0xy-Pa55w0rd").decode()
    out = Scrubber(config_secrets(loaded)).scrub(f"Proxy-Authorization: Basic {basic} was refused")
    assert basic not in out and basic[:12] not in out and REDACTED in out


@pytest.mark.parametrize("field", ["base_url", "tokenizer_url", "deployments.eu.base_url"])
def test_credentials_in_an_upstream_url_are_refused(field: str) -> None:
    url = "https://svc:hunter2-secret@upstream.example/v1"
    provider: dict[str, Any] = {"kind": "vllm", "base_url": "https://upstream.example/v1"}
    if field == "deployments.eu.base_url":
        provider["deployments"] = {"eu": {"base_url": url}}
    else:
        provider[field] = url
    with pytest.raises(ConfigError) as info:
        parse_config(json.dumps({"providers": {"up": provider}}), "config.yaml", env={})
    assert f"providers.up.{field}: must not carry credentials" in str(info.value)
    assert "hunter2" not in str(info.value)
