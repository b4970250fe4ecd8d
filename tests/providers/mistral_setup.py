"""Mistral tests' shared setup: the adapter, its endpoint, the quoted stream and the field lists."""

from __future__ import annotations

import json
from typing import Any

from providers.mistral import MistralAdapter

ADAPTER = MistralAdapter()


PROMPT = "Tell me a joke about OpenTelemetry"


def encode(value: Any) -> bytes:
    return json.dumps(value).encode()
