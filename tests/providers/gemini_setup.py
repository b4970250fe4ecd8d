"""Gemini tests' shared setup: the adapter, its endpoint and the quoted upstream bodies."""

from __future__ import annotations

import json
from typing import Any

from providers.gemini import GeminiAdapter

ADAPTER = GeminiAdapter()


def encode(value: Any) -> bytes:
    return json.dumps(value).encode()
