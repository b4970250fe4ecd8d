"""providers/envelope.py on its own: which status an error envelope's words mean."""

from __future__ import annotations

import json

import pytest

from providers.base import CallContext
from providers.envelope import envelope_status
from providers.openai import OpenAIAdapter
from tests.helpers.faults import RECORDED_COMPLETION


@pytest.mark.parametrize(
    ("words", "status"),
    [
        (("insufficient_quota",), 429),
        ((None, "rate_limit_error"), 429),
        (("RESOURCE_EXHAUSTED",), 429),
        (("overloaded_error",), 503),
        (("invalid_request_error",), 400),
        (("model_not_found",), 404),
        (("invalid_api_key",), 401),
        ((503, "whatever"), 503),
        (("429",), 429),
        ((200, "server_error"), 500),  # a code outside 400-599 says nothing; unknown words mean 500
        ((True, ["odd"], {"x": 1}), 500),
        ((), 500),
    ],
)
def test_words_to_status(words: tuple[object, ...], status: int) -> None:
    assert envelope_status(*words) == status


def test_an_answer_with_odd_types_in_error_only_fields_still_parses() -> None:
    body = json.dumps({**RECORDED_COMPLETION, "object": 5, "type": ["x"], "code": {"y": 1}}).encode()
    c = OpenAIAdapter().parse_response(body, CallContext(id="cmpl-x", created=1, model="m"))
    assert c.choices[0].text == RECORDED_COMPLETION["choices"][0]["text"]
