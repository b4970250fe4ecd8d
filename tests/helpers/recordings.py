"""The recorded provider bodies and headers in tests/fixtures (where each came from: SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def fixture_bytes(rel: str) -> bytes:
    """A recorded provider body from tests/fixtures (copied from /work/shared/fixtures; see SOURCES.md)."""
    return (FIXTURES / rel).read_bytes()


def fixture_json(rel: str) -> Any:
    return json.loads(fixture_bytes(rel))


def fixture_headers(rel: str) -> dict[str, str]:
    """A recorded `*.headers.json` ({name: [values]}) as the lower-cased single-valued map aiohttp exposes."""
    raw: dict[str, list[str]] = fixture_json(rel)
    return {name.lower(): values[0] for name, values in raw.items()}


def sse_events(raw: bytes) -> list[bytes]:
    """Split a recorded SSE body into its events, each without the blank line that ends it."""
    return [e for e in raw.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]
