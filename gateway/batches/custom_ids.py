"""The custom_id of a line too long to hold (over `caps.request_body_bytes`), found without holding it.

A line is `{"custom_id": ..., "method": ..., "url": ..., "body": {...}}` in any order, the body being what
makes it long. Its top-level members are read from both ends, each a key and a scalar value: forwards from
its first byte through its held head, and backwards from its closing `}` through its last TAIL_BYTES, each
stopping at the first object or array value (the body), whose inside is never scanned (a `custom_id` key
nested in the body is not the line's). So the custom_id is found wherever it sits before or after the body;
one between two object or array values is not, and its line fails the batch saying so.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

# What is kept of a long line's end while the rest of it goes by: its custom_id must fit in it when it
# comes after the body.
TAIL_BYTES: Final = 64 * 1024
# Top-level members read from each end: a batch line has four; this bounds the work on a hostile one.
MAX_MEMBERS: Final = 64

# Written out whole (no pattern is built at run time): `[ \t\r\n]*` is JSON's whitespace, a string is
# `"[^"\\]*(?:\\.[^"\\]*)*"`, a scalar a string, a number or a literal.
_OPEN: Final = re.compile(rb"[ \t\r\n]*\{")
# Forwards: `"key" : scalar` and the `,` or `}` after it.
_MEMBER: Final = re.compile(
    rb'[ \t\r\n]*("[^"\\]*(?:\\.[^"\\]*)*")[ \t\r\n]*:[ \t\r\n]*'
    rb'("[^"\\]*(?:\\.[^"\\]*)*"|[-+.0-9eE]+|true|false|null)[ \t\r\n]*([,}])',
    re.DOTALL,
)
# The same read on the reversed bytes. A string ends (reversed: starts) at a quote no backslash escapes, and
# in a valid line a member's opening quote follows `{`, `,`, `:` or a space, never a backslash: so reversed,
# a quote followed by a backslash is inside the string and one followed by anything else opens it.
_R_CLOSE: Final = re.compile(rb"[ \t\r\n]*\}")
_R_MEMBER: Final = re.compile(
    rb'[ \t\r\n]*("[^"]*(?:"(?=\\)[^"]*)*"(?!\\)|eurt|eslaf|llun|[-+.0-9eE]+)[ \t\r\n]*:[ \t\r\n]*'
    rb'("[^"]*(?:"(?=\\)[^"]*)*"(?!\\))[ \t\r\n]*([,{])',
    re.DOTALL,
)


def _text(raw: bytes) -> str | None:
    try:
        return msgspec.json.decode(raw, type=str)
    except msgspec.MsgspecError:
        return None


def head_id(head: bytes, end: int) -> str | None:
    """The custom_id among the top-level members `head` (a line's first `end` bytes) opens with."""
    opened = _OPEN.match(head, 0, end)
    if opened is None:
        return None
    at = opened.end()
    for _ in range(MAX_MEMBERS):
        member = _MEMBER.match(head, at, end)
        if member is None:  # an object or array value, or the head's end
            return None
        if _text(member[1]) == "custom_id":
            return _text(member[2])
        if member[3] == b"}":
            return None
        at = member.end()
    return None


def tail_id(tail: bytes) -> str | None:
    """The custom_id among the top-level members `tail` (a line's last bytes) ends with."""
    back = tail[::-1]
    closed = _R_CLOSE.match(back)
    if closed is None:
        return None
    at = closed.end()
    for _ in range(MAX_MEMBERS):
        member = _R_MEMBER.match(back, at)
        if member is None:
            return None
        if _text(member[2][::-1]) == "custom_id":
            return _text(member[1][::-1])
        if member[3] == b"{":
            return None
        at = member.end()
    return None


def find_id(head: bytes, end: int, tail: bytes) -> str | None:
    """The line's top-level custom_id as a string, from its first `end` bytes (`head`) or its last bytes
    (`tail`, at most TAIL_BYTES); None where neither end shows it (or it is not a string)."""
    found = head_id(head, end)
    return found if found is not None else tail_id(tail[-TAIL_BYTES:])


__all__ = ["MAX_MEMBERS", "TAIL_BYTES", "find_id", "head_id", "tail_id"]
