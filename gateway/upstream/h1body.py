"""Body decoding for the h1 client: gzip and deflate, inflated in caller-bounded steps (a bomb cannot
expand past what the reader takes).
"""

from __future__ import annotations

import zlib
from typing import Final

# A relayed compressed stream is decoded at most this much at a time: one socket read of a bomb
# cannot expand into more than this before the reader has taken it.
_INFLATE_STEP: Final = 64 * 1024


class _Inflate:
    """gzip or deflate decoding whose output per call is bounded by the caller.

    `deflate` is meant to be zlib-wrapped (RFC 9110 8.4.1.2), but some servers send raw deflate: the first
    two bytes tell them apart, as browsers and httpx do.
    """

    __slots__ = ("_z", "_probe")

    def __init__(self, gzip: bool) -> None:
        self._z = zlib.decompressobj(16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS)
        self._probe: bytes | None = None if gzip else b""

    def decode(self, data: bytes, limit: int) -> tuple[bytes, bytes]:
        """(at most `limit` decoded bytes, the input not consumed yet)."""
        if self._probe is not None:
            data = self._probe + data
            if len(data) < 2:
                self._probe = data
                return b"", b""
            self._probe = None
            cmf, flg = data[0], data[1]
            if cmf & 0x0F != 8 or cmf >> 4 > 7 or (cmf << 8 | flg) % 31:
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
        z = self._z
        if z.eof:
            return b"", b""  # bytes after the end of the compressed stream are ignored, as httpx does
        out = z.decompress(data, limit)
        # At the end of the stream zlib leaves what follows in unconsumed_tail too; handed back, it would
        # never be consumed and the reader would spin on it.
        return out, b"" if z.eof else z.unconsumed_tail

    def flush(self) -> bytes:
        # Only called once every input byte was consumed, so what is left is bounded by zlib's window.
        return self._z.flush()
