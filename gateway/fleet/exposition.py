"""A replica's Prometheus text exposition read as it arrives: inflated and parsed piece by piece, within a cap.

Nothing of a body is held whole. Each piece from the wire is inflated (gzip or deflate) at most `PIECE`
bytes at a time, and each inflated piece is scanned for the wanted series at once, so the memory of a
read is one piece and one unfinished line, however large or compressed the body is, and the work per
piece is bounded (a regular-expression scan in C and a set lookup per sample line). Past `max_bytes`
on the wire or inflated, the read stops: a body that large is not metrics.

A replica may send anything, so a sample that is not a number, negative, infinite, NaN or above
`MAX_GAUGE` makes its series invalid, and a reading with an invalid series is refused whole: a replica
claiming -1e9 waiting requests would otherwise draw every request.
"""

from __future__ import annotations

import math
import re
import zlib
from typing import Final

from gateway.fleet.picker import EngineLoad
from providers.engine import EngineGauges

# The most inflated bytes one decompression step may produce (and so the most one piece holds).
PIECE: Final = 64 * 1024
# A line longer than this is no sample the gateway wants (vLLM's longest are a few hundred bytes): skipped.
MAX_LINE: Final = 64 * 1024
# The most requests a replica may claim waiting or running; more is a lie, not a load.
MAX_GAUGE: Final = 1_000_000.0


class Unreadable(Exception):
    """Why a replica's exposition gives no load: the message says it (never with the replica's bytes), `kind`
    names it in one word for a metric label."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


# A sample line: the name, optional labels (label values may hold `}`: up to the line's last one that is
# followed by the value), then the value; a timestamp may follow. Comments and blank lines do not match.
_SAMPLE: Final = re.compile(rb"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^\n]*\})?[ \t]+([^ \t\r\n]+)", re.MULTILINE)


class Inflater:
    """A body's `content-encoding` undone in bounded steps: identity, gzip or deflate (zlib)."""

    def __init__(self, encoding: str) -> None:
        coding = encoding.strip().lower()
        if coding in ("", "identity"):
            self._z: zlib._Decompress | None = None
        elif coding in ("gzip", "x-gzip", "deflate"):
            self._z = zlib.decompressobj(32 + zlib.MAX_WBITS)  # gzip or zlib header, detected
        else:
            raise Unreadable(f"unsupported content-encoding {coding[:32]!r}", "encoding")

    def pieces(self, data: bytes) -> list[bytes]:
        """What `data` inflates to, in pieces of at most PIECE bytes; the caller counts them against its cap
        before asking for more, so a bomb is stopped after the cap, not after inflating it whole."""
        z = self._z
        if z is None:
            return [data]
        try:
            out = z.decompress(data, PIECE)
        except zlib.error:
            raise Unreadable("malformed compressed body", "encoding") from None
        return [out] if out else []

    def more(self) -> bytes:
        """The next piece of the last `data` (empty when it is all inflated)."""
        z = self._z
        if z is None or z.eof:
            return b""
        try:
            return z.decompress(z.unconsumed_tail, PIECE)
        except zlib.error:
            raise Unreadable("malformed compressed body", "encoding") from None


class Exposition:
    """One read's parse: `feed` the body's (inflated) pieces in order, then `load`."""

    def __init__(self, gauges: EngineGauges, max_bytes: int) -> None:
        self._gauges = gauges
        self._max = max_bytes
        self._wanted = frozenset(n.encode() for n in (*gauges.waiting, *gauges.running, *gauges.kv_usage))
        self._kv = frozenset(gauges.kv_usage)
        self._carry = b""
        self._skipping = False  # inside a line longer than MAX_LINE
        self._sums: dict[str, float] = {}
        self._invalid: str | None = None
        self.size = 0

    def feed(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.size > self._max:
            raise Unreadable(f"larger than {self._max} bytes", "too_large")
        if self._skipping:
            cut = piece.find(b"\n")
            if cut < 0:
                return
            self._skipping = False
            piece = piece[cut + 1 :]
        carried = self._carry
        buf = carried + piece if carried else piece
        cut = buf.rfind(b"\n")
        if cut < 0:
            self._carry = buf
        else:
            start = 0
            if carried:
                # The carried line ends in this piece: past MAX_LINE all told, it is skipped as a longer one is.
                first = buf.find(b"\n")
                if first > MAX_LINE:
                    start = first + 1
            self._scan(buf, start, cut + 1)
            self._carry = buf[cut + 1 :]
        if len(self._carry) > MAX_LINE:
            self._carry = b""
            self._skipping = True

    def _scan(self, buf: bytes, start: int, end: int) -> None:
        sums = self._sums
        for m in _SAMPLE.finditer(buf, start, end):
            raw = m.group(1)
            if raw not in self._wanted:
                continue
            name = raw.decode()
            try:
                value = float(m.group(2))
            except ValueError:
                continue  # not a sample of ours after all (a name that only starts like one)
            limit = 1.0 if name in self._kv else MAX_GAUGE
            if not (0.0 <= value <= limit):  # NaN fails every comparison
                self._invalid = self._invalid or name
                continue
            # Summed over labels (a data-parallel engine reports per engine); the KV usage is the fullest one.
            sums[name] = max(sums.get(name, 0.0), value) if name in self._kv else sums.get(name, 0.0) + value

    def load(self) -> EngineLoad:
        """The load of the whole body fed. Raises Unreadable: an invalid value, or no waiting-queue series."""
        if self._carry and not self._skipping:
            self._scan(self._carry + b"\n", 0, len(self._carry) + 1)  # a last line without its newline
            self._carry = b""
        if self._invalid is not None:
            raise Unreadable(f"an invalid value of {self._invalid} (negative, not finite or absurd)", "invalid_value")
        sums = self._sums

        def first(names: tuple[str, ...]) -> float | None:
            return next((sums[n] for n in names if n in sums), None)

        waiting = first(self._gauges.waiting)
        if waiting is None:
            raise Unreadable(f"no {self._gauges.waiting[0]} series", "no_series")
        running = first(self._gauges.running) or 0.0
        if waiting > MAX_GAUGE or running > MAX_GAUGE or math.isinf(waiting + running):
            raise Unreadable("an absurd total of waiting or running requests", "invalid_value")
        return EngineLoad(waiting=waiting, running=running, kv_usage=first(self._gauges.kv_usage))


def parse(body: bytes, gauges: EngineGauges, max_bytes: int = 1 << 62) -> EngineLoad:
    """The load in one whole exposition (what a read of it yields). Raises Unreadable."""
    exp = Exposition(gauges, max_bytes)
    for start in range(0, len(body), PIECE):
        exp.feed(body[start : start + PIECE])
    return exp.load()
