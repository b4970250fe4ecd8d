"""A header value as sent: text that may carry client input (a model name) made safe to write in a head.

Anything that is not printable ASCII is percent-encoded as UTF-8, so a header can always be sent and never
splits or breaks the response; `%` itself is encoded too, so an encoded value cannot be mistaken for one that
was not. The endpoints and the cache's early answers (gateway/cache/hit.py) encode their headers with it.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import quote

# Printable ASCII except `%`.
HEADER_SAFE: Final = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def header_value(value: str) -> bytes:
    """`value` as a header's bytes: as it is when printable ASCII, else percent-encoded."""
    if value.isascii() and value.isprintable():
        return value.encode("ascii")
    return quote(value, safe=HEADER_SAFE).encode("ascii")


__all__ = ["HEADER_SAFE", "header_value"]
