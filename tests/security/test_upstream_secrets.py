"""Item 12 of issue 11: upstream text never carries the gateway's own credentials to a client or a log.

An upstream that refuses the gateway's key often quotes it back; the gateway relays upstream error text,
so before this fix a client read the provider key in the 401's message (and in a mid-stream error
event), and the access log carried whatever the upstream put in its error `code`. Real sockets
throughout: uvicorn serving the gateway, an aiohttp upstream on loopback, raw HTTP and the openai SDK.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.ops import accesslog
from tests.helpers.clients import sse_data
from tests.helpers.servers import GatewayThread, serve_config
from tests.helpers.upstreams import Upstream, reply, reply_sse

PROVIDER_KEY = "sk-live-7Qm2xV9pL4tR8wZ1cB6nH3jK5dF0gS"
DEPLOYMENT_KEY = "az-4f9b2c7e1d8a6035b9e2f7c4a1d0e8b3"
HEADER_TOKEN = "tok-Zx81Qw72Er63Ty54Ui45"
BEDROCK_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SECRETS = (PROVIDER_KEY, DEPLOYMENT_KEY, HEADER_TOKEN, BEDROCK_SECRET)

CONFIG = """
server: {{host: 127.0.0.1, port: 0}}
retries: {{attempts: 1}}
providers:
  up:
    kind: openai
    api_key: "${{UP_KEY}}"
    base_url: "{u}/up/v1"
    headers: {{x-upstream-token: "${{UP_TOKEN}}", x-team: platform}}
  az:
    kind: azure
    api_key: unused-default-key-000
    base_url: "{u}/az"
    api_version: "2024-02-01"
    deployments:
      eu: {{api_key: "${{AZ_KEY}}", base_url: "{u}/az-eu"}}
  br: {{kind: bedrock, api_key: "AKIAIOSFODNN7EXAMPLE:${{BR_SECRET}}", region: us-east-1, base_url: "{u}/br"}}
"""
ENV = {"UP_KEY": PROVIDER_KEY, "UP_TOKEN": HEADER_TOKEN, "AZ_KEY": DEPLOYMENT_KEY, "BR_SECRET": BEDROCK_SECRET}


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with Upstream() as server:
        yield server


@pytest.fixture
def gateway(upstream: Upstream, tmp_path: Path) -> Iterator[GatewayThread]:
    with serve_config(tmp_path, CONFIG.format(u=upstream.url), ENV) as gw:
        yield gw


@pytest.fixture
def access_lines() -> Iterator[list[bytes]]:
    lines: list[bytes] = []
    accesslog.SINK.listeners.append(lines.append)
    try:
        yield lines
    finally:
        accesslog.SINK.listeners.remove(lines.append)


# A run this long of a secret's characters is a leak of it (gateway/upstream/scrub.py's FRAGMENT).
FRAGMENT = 12


def leaks(text: str) -> list[str]:
    """Every secret of which `text` holds a run of FRAGMENT characters, or the last 4 behind a mask."""
    found = []
    for secret in SECRETS:
        if any(secret[i : i + FRAGMENT] in text for i in range(len(secret) - FRAGMENT + 1)):
            found.append(secret)
        elif "*" + secret[-4:] in text or "..." + secret[-4:] in text:
            found.append(secret)
    return found


def openai_error(message: str, code: str = "invalid_api_key") -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    ).encode()


ECHOES = [
    pytest.param(f"Token rejected: Bearer {PROVIDER_KEY}", id="whole-key"),
    pytest.param(f"Incorrect API key provided: {PROVIDER_KEY[:20]}", id="first-20-chars"),
    pytest.param(f"Incorrect API key provided: sk-live-************{PROVIDER_KEY[-4:]}.", id="openai-masked"),
    pytest.param(f"Incorrect API key provided: sk-...{PROVIDER_KEY[-4:]}", id="dots-masked"),
    pytest.param(f"bad header x-upstream-token={HEADER_TOKEN}; key={PROVIDER_KEY[5:30]}", id="header-and-middle"),
]


@pytest.mark.parametrize("message", ECHOES)
def test_401_echoing_the_key_never_reaches_the_client_or_the_access_log(
    gateway: GatewayThread, upstream: Upstream, access_lines: list[bytes], message: str
) -> None:
    upstream.handler = reply(openai_error(message, code=f"key_{PROVIDER_KEY}"), status=401)
    with httpx.Client(trust_env=False, timeout=15) as client:
        resp = client.post(gateway.url + "/v1/completions", json={"model": "up/davinci-002", "prompt": "x"})
    assert resp.status_code == 502
    assert "[redacted]" in resp.json()["error"]["message"]
    assert leaks(resp.text) == []
    assert leaks(str(resp.headers)) == []
    deadline = time.monotonic() + 5  # the access line is written just after the answer is sent
    while not access_lines and time.monotonic() < deadline:
        time.sleep(0.01)
    assert access_lines and leaks(b"".join(access_lines).decode()) == []


def _forms(secret: str) -> list[str]:
    """What an upstream may turn a key into before quoting it back, each long enough to be a leak."""
    raw = secret.encode()
    return [
        base64.b64encode(raw).decode()[:16],
        base64.b64encode(b"Bearer " + raw).decode()[12:28],
        raw.hex()[:16],
        raw.hex().upper()[:16],
        "".join(f"\\x{b:02x}" for b in raw[:8]),
        secret.upper()[:12],
        *(secret[i : i + 8] for i in range(0, len(secret) - 7, 8)),
    ]


RE_ENCODED = [
    pytest.param(f"key {base64.b64encode(PROVIDER_KEY.encode()).decode()} rejected", None, id="base64"),
    pytest.param(f"Basic {base64.b64encode(b'Bearer ' + PROVIDER_KEY.encode()).decode()}", None, id="base64-shifted"),
    pytest.param(f"key 0x{PROVIDER_KEY.encode().hex()} rejected", None, id="hex"),
    pytest.param(f"KEY {PROVIDER_KEY.encode().hex().upper()}", None, id="hex-upper"),
    pytest.param("key " + "".join(f"\\x{b:02x}" for b in PROVIDER_KEY.encode()), None, id="x-escapes"),
    pytest.param(f"INVALID KEY {PROVIDER_KEY.upper()}", None, id="upper-cased"),
    pytest.param("key parts: " + ", ".join(PROVIDER_KEY[i : i + 9] for i in range(0, 36, 9)), None, id="pieces"),
    pytest.param(f"invalid key {PROVIDER_KEY[:7]}", PROVIDER_KEY[7:13], id="split-message-param"),
]


@pytest.mark.parametrize(("message", "param"), RE_ENCODED)
def test_a_re_encoded_key_never_reaches_the_client(
    gateway: GatewayThread, upstream: Upstream, message: str, param: str | None
) -> None:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": "invalid_api_key"}}
    upstream.handler = reply(json.dumps(body).encode(), status=401)
    with httpx.Client(trust_env=False, timeout=15) as client:
        resp = client.post(gateway.url + "/v1/completions", json={"model": "up/davinci-002", "prompt": "x"})
    assert resp.status_code == 502
    error = resp.json()["error"]
    shown = f"{error['message']}{error['param'] or ''}"
    assert "[redacted]" in shown
    assert [f for f in _forms(PROVIDER_KEY) if f in shown] == []
    if param is not None:
        assert PROVIDER_KEY[:7] not in error["message"] and PROVIDER_KEY[7:13] not in (error["param"] or "")


def test_plain_text_500_echoing_every_kind_of_secret(gateway: GatewayThread, upstream: Upstream) -> None:
    body = f"upstream proxy failed: Authorization: Bearer {DEPLOYMENT_KEY} secret={BEDROCK_SECRET}".encode()
    upstream.handler = reply(body, status=500, headers={"content-type": "text/plain"})
    with httpx.Client(trust_env=False, timeout=15) as client:
        resp = client.post(gateway.url + "/v1/completions", json={"model": "az/gpt/eu", "prompt": "x"})
    assert resp.status_code == 502
    assert leaks(resp.text) == []
    assert "upstream proxy failed" in resp.json()["error"]["message"]


def test_error_event_mid_stream_echoing_the_key_is_scrubbed(gateway: GatewayThread, upstream: Upstream) -> None:
    first = {
        "id": "c1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"text": "Hi", "index": 0}],
    }
    failure = {"error": {"message": f"stream aborted for key {PROVIDER_KEY}", "type": "server_error", "code": None}}
    upstream.handler = reply_sse([b"data: " + json.dumps(first).encode(), b"data: " + json.dumps(failure).encode()])
    with httpx.Client(trust_env=False, timeout=15) as client:
        resp = client.post(
            gateway.url + "/v1/completions", json={"model": "up/davinci-002", "prompt": "x", "stream": True}
        )
    data = sse_data(resp.text)
    assert json.loads(data[0])["choices"][0]["text"] == "Hi"
    assert "[redacted]" in json.loads(data[1])["error"]["message"]
    assert data[-1] == "[DONE]"
    assert leaks(resp.text) == []


def test_relayed_upstream_message_is_capped(gateway: GatewayThread, upstream: Upstream) -> None:
    upstream.handler = reply(openai_error("x" * 50_000, code="server_error"), status=500)
    with httpx.Client(trust_env=False, timeout=15) as client:
        resp = client.post(gateway.url + "/v1/completions", json={"model": "up/davinci-002", "prompt": "x"})
    assert resp.status_code == 502
    assert len(resp.json()["error"]["message"]) <= 1000  # caps.upstream_message_chars


def test_gateway_log_lines_are_scrubbed(gateway: GatewayThread, caplog: pytest.LogCaptureFixture) -> None:
    # A traceback from an adapter that choked on an upstream answer carries the answer's text; the
    # running gateway's config registered its secrets with the `gateway` logger's filter.
    caplog.set_level(logging.ERROR, logger="gateway")
    try:
        raise ValueError(f"could not read {PROVIDER_KEY}")
    except ValueError:
        logging.getLogger("gateway").exception("parsing failed for %s", HEADER_TOKEN)
    text = caplog.text
    assert "parsing failed" in text and "could not read" in text
    assert leaks(text) == []
