"""The gateway's own stop-string scanning, for providers that lack stops (gateway/emulation/planning.py)."""

from __future__ import annotations

import pytest

from gateway import emulation

# -- stop scanning -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pieces", "stops", "include", "sent", "stopped"),
    [
        # Only the characters that could still begin a stop are held back.
        (["Hello wor", "ld! END", " tail"], ["END"], False, ["Hello wor", "ld! "], True),
        (["ab", "cE", "N", "D"], ["END"], True, ["ab", "c", "", "END"], True),
        (["xE", "Nope"], ["END"], False, ["x", "ENope"], False),
        (["aaXY", "Zb"], ["XYZ", "YZQ"], False, ["aa", ""], True),
    ],
)
def test_stop_scanner_holds_back_only_possible_starts(
    pieces: list[str], stops: list[str], include: bool, sent: list[str], stopped: bool
) -> None:
    scanner = emulation.StopScanner(stops, include)
    out: list[str] = []
    hit = False
    for piece in pieces:
        text, hit = scanner.feed(piece)
        out.append(text)
        if hit:
            break
    assert out == sent
    assert hit is stopped


def test_find_stop_takes_the_earliest() -> None:
    assert emulation.find_stop("one two three", ["three", "two"]) == (4, "two")
    assert emulation.find_stop("nothing", ["x"]) is None
