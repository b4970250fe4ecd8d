"""A replica's Prometheus text exposition read as it arrives: inflated and parsed piece by piece, within a cap.

Nothing of a body is held whole. Each piece from the wire is inflated (gzip or deflate) at most `PIECE`
bytes at a time, and each inflated piece is scanned for the wanted series at once, so the memory of a
read is one piece and one unfinished line, however large or compressed the body is. The scan is a
regular expression that names only the wanted series, so every other line is passed over in C: Python
runs once per sample of a wanted series, and at most `MAX_SAMPLES` times per read. Past `max_bytes`
inflated, the read stops: a body that large is not metrics.

A replica may send anything, so a sample that is not a number, negative, infinite, NaN or above
`MAX_GAUGE` makes its series invalid, and a reading with an invalid series is refused whole: a replica
claiming -1e9 waiting requests would otherwise draw every request.
"""

from __future__ import annotations

import functools
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
# The most samples of the wanted series one read may hold: one per engine and model in a real exposition
# (tens), while each costs a Python step; more is a body built to keep the event loop busy.
MAX_SAMPLES: Final = 10_000


class Unreadable(Exception):
    """Why a replica's exposition gives no load: the message says it (never with the replica's bytes), `kind`
    names it in one word for a metric label."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@functools.cache
def samples_of(names: tuple[str, ...]) -> re.Pattern[bytes]:
    """A sample line of one of `names`: the name, optional labels (label values may hold `}`: up to the line's
    last one that is followed by the value), then the value; a timestamp may follow. A longer name that
    starts with a wanted one (`..._total`) fails at the byte after it; comments and blank lines at `^`.

    Linear in the text: `^` lets a match start only at a line's first byte, the names are literals, and the
    one backtracking part, the labels, is bounded by the line (and lines by MAX_LINE)."""
    alternatives = b"|".join(re.escape(n.encode()) for n in names)
    return re.compile(rb"^(" + alternatives + rb")(?:\{[^\n]*\})?[ \t]+([^ \t\r\n]+)", re.MULTILINE)


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
        names = (*gauges.waiting, *gauges.running, *gauges.kv_usage)
        self._sample = samples_of(names)
        self._names = {n.encode(): n for n in names}
        self._kv = frozenset(gauges.kv_usage)
        # An unfinished line waits here; a bytearray grows by what arrives instead of being copied per piece.
        self._carry = bytearray()
        self._skipping = False  # inside a line longer than MAX_LINE
        self._sums: dict[str, float] = {}
        self._invalid: str | None = None
        self._samples = 0
        self.size = 0

    def feed(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.size > self._max:
            raise Unreadable(f"larger than {self._max} bytes", "too_large")
        start = 0
        if self._skipping:
            cut = piece.find(b"\n")
            if cut < 0:
                return
            self._skipping = False
            start = cut + 1
        carry = self._carry
        cut = piece.rfind(b"\n", start)
        if cut < 0:
            carry += memoryview(piece)[start:]
        else:
            if carry:
                # The carried line ends in this piece: past MAX_LINE all told, it is skipped as a longer one is.
                first = piece.find(b"\n", start) + 1
                if len(carry) + first - start <= MAX_LINE + 1:
                    carry += memoryview(piece)[start:first]
                    self._scan(carry, 0, len(carry))
                carry.clear()
                start = first
            self._scan(piece, start, cut + 1)
            carry += memoryview(piece)[cut + 1 :]
        if len(carry) > MAX_LINE:
            carry.clear()
            self._skipping = True

    def _scan(self, buf: bytes | bytearray, start: int, end: int) -> None:
        sums = self._sums
        for m in self._sample.finditer(buf, start, end):
            self._samples += 1
            if self._samples > MAX_SAMPLES:
                raise Unreadable(f"more than {MAX_SAMPLES} samples of its load series", "too_large")
            name = self._names[m.group(1)]
            try:
                value = float(m.group(2))
            except ValueError:
                continue  # not a number: no sample of ours
            limit = 1.0 if name in self._kv else MAX_GAUGE
            if not (0.0 <= value <= limit):  # NaN fails every comparison
                self._invalid = self._invalid or name
                continue
            # Summed over labels (a data-parallel engine reports per engine); the KV usage is the fullest one.
            sums[name] = max(sums.get(name, 0.0), value) if name in self._kv else sums.get(name, 0.0) + value

    def load(self) -> EngineLoad:
        """The load of the whole body fed. Raises Unreadable: an invalid value, or no waiting-queue series."""
        if self._carry and not self._skipping:
            self._carry += b"\n"  # a last line without its newline
            self._scan(self._carry, 0, len(self._carry))
            self._carry.clear()
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
