"""SGLang's OpenAI-compatible server: its own constrained-decoding fields (`regex`, `ebnf`, `json_schema` as a
JSON string, `sglang/srt/entrypoints/openai/protocol.py`), which a Fireworks-style `response_format` schema
becomes too; OpenAI's `response_format` passes as it is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from providers.base import Endpoint
from providers.sglang import SGLangAdapter
from tests.helpers.adapters import build, request

ADAPTER = SGLangAdapter()
MODEL = "Qwen/Qwen2.5-7B-Instruct"
ENDPOINT = Endpoint(provider="sgl", model=MODEL, base_url="http://127.0.0.1:30000/v1")
BASE = {"model": MODEL, "prompt": "Say this is a test"}
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize(
    ("field", "value", "target", "sent"),
    [
        ("guided_json", SCHEMA, "json_schema", json.dumps(SCHEMA, separators=(",", ":"))),
        ("guided_regex", "[0-9]{3}", "regex", "[0-9]{3}"),
        ("guided_grammar", 'root ::= "a" | "b"', "ebnf", 'root ::= "a" | "b"'),
    ],
)
def test_guided_fields_are_sglangs_own(field: str, value: Any, target: str, sent: Any) -> None:
    _, body, _ = build(ADAPTER, request(**{field: value}), ENDPOINT)
    assert body == {**BASE, target: sent}


def test_a_fireworks_style_schema_is_a_json_schema_constraint_not_dropped() -> None:
    _, body, _ = build(ADAPTER, request(response_format={"type": "json_object", "schema": SCHEMA}), ENDPOINT)
    assert "response_format" not in body and json.loads(body["json_schema"]) == SCHEMA


@pytest.mark.parametrize(
    "response_format",
    [{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}],
)
def test_other_response_formats_pass_through(response_format: dict[str, Any]) -> None:
    _, body, _ = build(ADAPTER, request(response_format=response_format), ENDPOINT)
    assert body == {**BASE, "response_format": response_format}
