"""Where a YAML key's shared counters live in Redis: under its identity (a fingerprint of its secret),
never its name, so a test names them by the secret it configured."""

from __future__ import annotations

from gateway.limits.auth import fingerprint


def bucket(secret: str, kind: str) -> str:
    """The rate-limit bucket of the YAML key with `secret`: `rl:{key:cfg_…}:<kind>`."""
    return "rl:{key:" + fingerprint(secret.encode()) + "}:" + kind


def usage(day: str, secret: str) -> str:
    """The day's usage hash of the YAML key with `secret`."""
    return f"usage:{day}:{fingerprint(secret.encode())}"


def month_spend(month: str, secret: str) -> str:
    """The month's spend counter (without a ledger) of the YAML key with `secret`."""
    return f"spend:{month}:key:{fingerprint(secret.encode())}"
