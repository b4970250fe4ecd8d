"""AWS Bedrock: SigV4 signing against AWS's published test-suite vectors."""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime
from typing import Any

import pytest

from providers import sigv4
from tests.helpers.recordings import fixture_json
from tests.providers.bedrock_setup import NOW

SUITE = fixture_json("bedrock/sigv4_test_suite.json")


# --- SigV4: AWS's published test suite -------------------------------------------------------------


@pytest.mark.parametrize("case", SUITE["cases"], ids=lambda c: c["name"])
def test_sigv4_reproduces_the_published_test_suite(case: dict[str, Any]) -> None:
    when = datetime.fromisoformat(SUITE["timestamp"].replace("Z", "+00:00"))
    # The date and the token are added by sign(); every other header of the suite request is signed as given.
    headers = {k: v for k, v in case["headers"] if k.lower() not in ("x-amz-date", "x-amz-security-token")}
    query = "?" + case["query"] if case["query"] else ""
    out = sigv4.sign(
        method=case["method"],
        url="https://example.amazonaws.com" + case["path"] + query,
        headers=headers,
        body=case["body"].encode(),
        access_key=SUITE["credentials"]["access_key_id"],
        secret_key=SUITE["credentials"]["secret_access_key"],
        region=SUITE["region"],
        service=SUITE["service"],
        now=when,
        session_token=case.get("session_token"),
    )
    assert out["authorization"] == case["authz"]
    assert out["x-amz-date"] == "20150830T123600Z"
    if "creq" in case:
        all_headers = {k: v for k, v in case["headers"]}
        creq, signed = sigv4.canonical_request(
            case["method"], case["path"], case["query"], all_headers, hashlib.sha256(case["body"].encode()).hexdigest()
        )
        assert creq == case["creq"]
        assert signed == case["authz"].split("SignedHeaders=")[1].split(",")[0]
        cscope = sigv4.scope("20150830", "us-east-1", "service")
        assert sigv4.string_to_sign("20150830T123600Z", cscope, creq) == case["sts"]


def test_signing_key_matches_the_documented_derivation() -> None:
    ex = SUITE["signing_key_example"]
    k_date = hmac.new(("AWS4" + ex["secret_access_key"]).encode(), ex["date"].encode(), hashlib.sha256).digest()
    k_region = hmac.new(k_date, ex["region"].encode(), hashlib.sha256).digest()
    k_service = hmac.new(k_region, ex["service"].encode(), hashlib.sha256).digest()
    assert (k_date.hex(), k_region.hex(), k_service.hex()) == (ex["k_date"], ex["k_region"], ex["k_service"])
    key = sigv4.signing_key(ex["secret_access_key"], ex["date"], ex["region"], ex["service"])
    assert key.hex() == ex["k_signing"]


def test_sigv4_needs_an_aware_time() -> None:
    with pytest.raises(ValueError):
        sigv4.amz_date(datetime(2026, 1, 2, 3, 4, 5))  # noqa: DTZ001 - the naive time is the point
    assert sigv4.amz_date(NOW) == "20260102T030405Z"


def test_host_of_keeps_the_port_and_drops_credentials() -> None:
    assert sigv4.host_of("http://127.0.0.1:8123/model/x/converse") == "127.0.0.1:8123"
    assert sigv4.host_of("https://user:pw@bedrock-runtime.eu-west-1.amazonaws.com/x") == (
        "bedrock-runtime.eu-west-1.amazonaws.com"
    )
