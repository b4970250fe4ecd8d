"""The request an adapter builds and a transport sends: a plain value, so adapters stay pure (no I/O)."""

from __future__ import annotations

import msgspec


class UpstreamRequest(msgspec.Struct):
    method: str
    url: str
    headers: dict[str, str]
    body: bytes
    stream: bool = False
