"""Every vendor's finish-reason vocabulary folded into stop | length | content_filter."""

from __future__ import annotations

import pytest

from providers.finish import finish_reason


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("stop", "stop"),
        ("eos", "stop"),
        ("eos_token", "stop"),
        ("stop_sequence", "stop"),
        ("end_turn", "stop"),
        ("tool_calls", "stop"),
        ("function_call", "stop"),
        ("length", "length"),
        ("max_tokens", "length"),
        ("model_length", "length"),
        ("content_filter", "content_filter"),
        ("refusal", "content_filter"),
        ("STOP", "stop"),
        ("MAX_TOKENS", "length"),
        ("Length", "length"),
    ],
)
def test_known_words(raw: str, expected: str) -> None:
    assert finish_reason(raw) == expected


@pytest.mark.parametrize("raw", ["", None])
def test_empty_means_not_finished(raw: str | None) -> None:
    assert finish_reason(raw) is None


def test_unknown_word_reads_as_stop() -> None:
    assert finish_reason("something_new") == "stop"
