"""The httpx transport's config: what only httpx can do is refused on h1, proxy credentials never appear in an
error, `auto` picks h1 unless httpx is needed."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, parse_config
from gateway.upstream.client import H1Transport
from gateway.upstream.httpx_transport import HttpxTransport
from tests.security.httpx_rig import Pki, patched_environ, upstream_for

# --------------------------------------------------------------------------------------------------
# Config


@pytest.mark.parametrize(
    ("setting", "path"),
    [
        ("proxy: 'http://127.0.0.1:1'", "providers.p.proxy"),
        ("http2: true", "providers.p.http2"),
        ("ca_bundle: '{ca}'", "providers.p.ca_bundle"),
        ("client_cert: '{ca}'", "providers.p.client_cert"),
    ],
)
def test_h1_with_what_only_httpx_can_do_is_a_config_error(setting: str, path: str, pki: Pki) -> None:
    text = f"providers:\n  p: {{kind: openai, api_key: k, transport: h1, {setting.format(ca=pki.ca_file)}}}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "gw.yaml", env={})
    message = str(info.value)
    assert message.startswith(f"gw.yaml: {path}: ") and "httpx" in message and "\n" not in message


def test_proxy_credentials_never_appear_in_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("providers:\n  p: {kind: openai, api_key: k, proxy: 'socks9://user:hunter2@h:1'}\n", env={})
    assert "hunter2" not in str(info.value) and "providers.p.proxy" in str(info.value)


def test_a_missing_ca_bundle_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"providers\.p\.ca_bundle: no such file"):
        parse_config("providers:\n  p: {kind: openai, api_key: k, ca_bundle: /nonexistent/ca.pem}\n", env={})


def test_auto_picks_h1_unless_httpx_is_needed(pki: Pki) -> None:
    with patched_environ({}):
        up = upstream_for(
            "  plain: {kind: openai, api_key: k, base_url: 'http://127.0.0.1:9/v1'}\n"
            "  h2: {kind: openai, api_key: k, http2: true}\n"
            f"  ca: {{kind: openai, api_key: k, ca_bundle: '{pki.ca_file}'}}\n"
            "  forced: {kind: openai, api_key: k, transport: httpx}\n"
        )
    assert isinstance(up.transport("plain"), H1Transport)
    assert all(isinstance(up.transport(n), HttpxTransport) for n in ("h2", "ca", "forced"))
