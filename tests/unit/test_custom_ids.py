"""An over-long line's custom_id read from its two ends (gateway/batches/custom_ids.py): found among the
top-level members before or after the body whatever their order or escapes, never inside the body, and never
made up from a tail cut in the middle of an escaped string."""

from __future__ import annotations

import json

import pytest

from gateway.batches.custom_ids import MAX_MEMBERS, TAIL_BYTES, find_id

BODY = '{"model": "fast", "prompt": "' + "p" * 1000 + '"}'


def _find(text: str, head: int = 200) -> str | None:
    raw = text.encode()
    return find_id(raw, head, raw[-TAIL_BYTES:])


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ('{"custom_id": "a", "method": "POST", "body": ' + BODY + "}", "a"),
        ('{"method": "POST", "url": "/v1/completions", "custom_id": "b", "body": ' + BODY + "}", "b"),
        ('{"method": "POST", "body": ' + BODY + ', "custom_id": "c", "url": "/v1/completions"}', "c"),
        ('{"body": ' + BODY + ',"custom_id":"d"}  ', "d"),
        ('{"body": ' + BODY + ', "custom\\u005fid": "e\\"\\\\", "n": -1.5e3, "t": true, "z": null}', 'e"\\'),
        # Inside the body, or between two object values: not the line's (or not found).
        ('{"method": "POST", "body": {"custom_id": "inner", "p": "' + "p" * 1000 + '"}, "url": "x"}', None),
        ('{"body": ' + BODY + ', "custom_id": "f", "metadata": {}}', None),
        ('{"body": ' + BODY + ', "custom_id": 7}', None),
        ("[1, 2, 3]" + " " * 1000, None),
    ],
)
def test_the_custom_id_is_read_from_either_end(text: str, found: str | None) -> None:
    json.loads(text)  # each case is a valid line
    assert _find(text) == found


def test_a_tail_cut_inside_an_escaped_string_makes_up_no_custom_id() -> None:
    """The tail starts right after a backslash, at an escaped quote: reversed, that quote looks like the
    start of a string, but no member can end there."""
    fake = '\\"custom_id\\": \\"evil'
    text = '{"body": ' + BODY + ', "note": "' + "x" * TAIL_BYTES + fake + '", "url": "/v1/completions"}'
    json.loads(text)
    raw = text.encode()
    cut = raw.index(b'"custom_id\\"')
    assert raw[cut - 1 : cut] == b"\\"
    assert find_id(raw, 200, raw[cut:]) is None


def test_members_are_read_up_to_a_bound_from_each_end() -> None:
    members = ", ".join(f'"k{i}": {i}' for i in range(MAX_MEMBERS))
    assert _find('{"body": ' + BODY + ", " + members + ', "custom_id": "near"}') == "near"
    assert _find('{"body": ' + BODY + ', "custom_id": "far", ' + members + "}") is None
