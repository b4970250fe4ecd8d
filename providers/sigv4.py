"""AWS Signature Version 4 for request headers, with nothing but hashlib and hmac.

Pure (the time is a parameter, nothing is read from the environment) and checked byte for byte against
AWS's published SigV4 test suite. The one path rule, sign the path as it goes on the wire, and its
sources: docs/provider-notes.md#sigv4.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final
from urllib.parse import parse_qsl, quote, urlsplit

ALGORITHM: Final = "AWS4-HMAC-SHA256"
EMPTY_SHA256: Final = hashlib.sha256(b"").hexdigest()


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def amz_date(now: datetime) -> str:
    """`20150830T123600Z`: the request time in UTC, as X-Amz-Date carries it."""
    if now.tzinfo is None:
        raise ValueError("SigV4 needs an aware datetime (UTC)")
    return now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


def signing_key(secret_key: str, date: str, region: str, service: str) -> bytes:
    """kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), service), "aws4_request")."""
    k_date = _hmac(("AWS4" + secret_key).encode("utf-8"), date)
    k_region = _hmac(k_date, region)
    k_service = _hmac(k_region, service)
    return _hmac(k_service, "aws4_request")


def canonical_uri(path: str) -> str:
    """Everything but the unreserved characters and `/` percent-encoded, `%` included (the double encoding)."""
    return quote(path or "/", safe="/")


def canonical_query(query: str) -> str:
    """Each name and value decoded, then encoded strictly (only A-Z a-z 0-9 - _ . ~), sorted by name, then value."""
    pairs = parse_qsl(query, keep_blank_values=True)
    encoded = sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~")) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def canonical_headers(headers: Mapping[str, str]) -> tuple[str, str]:
    """(canonical header block, signed header list) over every header given."""
    items = sorted((name.lower(), _collapse(value)) for name, value in headers.items())
    block = "".join(f"{name}:{value}\n" for name, value in items)
    return block, ";".join(name for name, _ in items)


def _collapse(value: str) -> str:
    # Leading and trailing spaces trimmed, inner runs collapsed to one (suite: get-header-value-trim).
    return " ".join(part for part in value.strip().split(" ") if part)


def canonical_request(
    method: str, path: str, query: str, headers: Mapping[str, str], payload_hash: str
) -> tuple[str, str]:
    """The canonical request text and its SignedHeaders value."""
    block, signed = canonical_headers(headers)
    text = "\n".join([method.upper(), canonical_uri(path), canonical_query(query), block, signed, payload_hash])
    return text, signed


def scope(date: str, region: str, service: str) -> str:
    return f"{date}/{region}/{service}/aws4_request"


def string_to_sign(stamp: str, credential_scope: str, creq: str) -> str:
    digest = hashlib.sha256(creq.encode("utf-8")).hexdigest()
    return f"{ALGORITHM}\n{stamp}\n{credential_scope}\n{digest}"


def host_of(url: str) -> str:
    """The Host header value for `url`: the authority without credentials (port kept when given)."""
    netloc = urlsplit(url).netloc
    return netloc.rpartition("@")[2]


def sign(
    *,
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    access_key: str,
    secret_key: str,
    region: str,
    service: str,
    now: datetime,
    session_token: str | None = None,
) -> dict[str, str]:
    """`headers` plus `host`, `x-amz-date`, `x-amz-security-token` (with temporary credentials) and
    `authorization`, every header in the result signed. Header names come back lower-cased."""
    stamp = amz_date(now)
    out = {name.lower(): value for name, value in headers.items()}
    out.setdefault("host", host_of(url))
    out["x-amz-date"] = stamp
    if session_token:
        out["x-amz-security-token"] = session_token
    out.pop("authorization", None)
    parts = urlsplit(url)
    creq, signed = canonical_request(method, parts.path, parts.query, out, hashlib.sha256(body).hexdigest())
    cscope = scope(stamp[:8], region, service)
    key = signing_key(secret_key, stamp[:8], region, service)
    signature = hmac.new(key, string_to_sign(stamp, cscope, creq).encode("utf-8"), hashlib.sha256).hexdigest()
    out["authorization"] = (
        f"{ALGORITHM} Credential={access_key}/{cscope}, SignedHeaders={signed}, Signature={signature}"
    )
    return out


__all__ = [
    "ALGORITHM",
    "EMPTY_SHA256",
    "amz_date",
    "canonical_headers",
    "canonical_query",
    "canonical_request",
    "canonical_uri",
    "host_of",
    "scope",
    "sign",
    "signing_key",
    "string_to_sign",
]
