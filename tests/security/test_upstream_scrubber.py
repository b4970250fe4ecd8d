"""gateway.upstream.scrub on its own: what counts as a secret in a config, what is cut, and that it stays linear."""

from __future__ import annotations

import logging
import time

import pytest

from gateway.config import parse_config
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
    base_url: "https://user:pw-cccccccccccc@host"
    api_version: "2024-02-01"
    deployments: {eu: {api_key: az-dddddddddddddddd}}
  c: {kind: bedrock, api_key: "AKIAEEEEEEEEEEEEEEEE:ffffffffffffffffffffffff", region: us-east-1}
keys: [{name: k, key: gk-gggggggggggggggg}]
admin: {key: adm-hhhhhhhhhhhhhhhh}
""",
        "config.yaml",
        env={},
    )
    found = config_secrets(loaded)
    for want in (
        "sk-aaaaaaaaaaaaaaaaaaaaaaaa",
        "tok-bbbbbbbbbbbbbbbb",
        "pw-cccccccccccc",
        "az-dddddddddddddddd",
        "AKIAEEEEEEEEEEEEEEEE",
        "ffffffffffffffffffffffff",
        "gk-gggggggggggggggg",
        "adm-hhhhhhhhhhhhhhhh",
    ):
        assert want in found
    assert "platform-team" not in found  # not a credential header


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
