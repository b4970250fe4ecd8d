"""Stop sequences the gateway enforces itself (docs/emulation.md): one automaton for all of them.

A request's stops are client text, up to `caps.stop_chars` characters together. Searching for each stop
separately costs (number of stops) x (text); an Aho-Corasick automaton over all of them costs one step per
character of text, however many stops there are. It is built once per set of stops (`matcher`, cached
so every attempt and every choice of a request shares it) and fed a stream chunk by chunk, carrying only
its state and the text that could still start a stop.

Which stop wins is `find_stop`'s rule everywhere: the earliest-starting one, then the first in the
request's list; a stream decides at the first chunk in which a stop is complete.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence


class StopMatcher:
    """The automaton: a trie of the stops with failure links, each node knowing the longest stop it ends with."""

    __slots__ = ("stops", "longest", "goto", "fail", "depth", "out", "below", "starts", "firsts", "marks", "latin")

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        goto: list[dict[str, int]] = [{}]
        depth = [0]
        own = [-1]  # the stop (its index in the list, the first of equal ones) a node spells, or -1
        for index, stop in enumerate(self.stops):
            node = 0
            for c in stop:
                nxt = goto[node].get(c)
                if nxt is None:
                    nxt = goto[node][c] = len(goto)
                    goto.append({})
                    depth.append(depth[node] + 1)
                    own.append(-1)
                node = nxt
            if stop and own[node] < 0:
                own[node] = index
        size = len(goto)
        fail = [0] * size
        out = own[:]  # the longest stop the node's text ends with: its own, else its failure node's
        order: list[int] = []
        queue = list(goto[0].values())
        while queue:  # breadth first: a node's failure node is shallower, so already done
            order.extend(queue)
            nxt_level: list[int] = []
            for node in queue:
                for c, child in goto[node].items():
                    f = fail[node]
                    while f and c not in goto[f]:
                        f = fail[f]
                    target = goto[f].get(c, 0)
                    fail[child] = target if target != child else 0
                    if out[child] < 0:
                        out[child] = out[fail[child]]
                    nxt_level.append(child)
            queue = nxt_level
        # The first (in the list) stop a node could still grow into, itself included.
        below = [i if i >= 0 else len(self.stops) for i in own]
        for node in reversed(order):
            for child in goto[node].values():
                below[node] = min(below[node], below[child])
        self.goto, self.fail, self.depth, self.out, self.below = goto, fail, depth, out, below
        self.longest = max(depth)
        # Where no stop is under way, the scan jumps to the next character that can start one, in C and
        # without a regex (the stops are client text). An ASCII piece is first checked for such a character
        # in one pass (most stream pieces hold none: skipped whole). Otherwise the piece's bytes (latin-1,
        # one per character) go through a 256-byte table (those characters to 0, the rest to 1) and
        # `bytes.find` jumps from one to the next; when a stop begins beyond latin-1, `str.find` for each
        # first character.
        self.starts = frozenset(goto[0])
        self.firsts = tuple(goto[0])
        self.marks = bytes(0 if chr(i) in self.starts else 1 for i in range(256))
        self.latin = all(ord(c) < 256 for c in self.firsts)  # then every first character has a byte of its own


@functools.lru_cache(maxsize=8)
def _matcher(stops: tuple[str, ...]) -> StopMatcher:
    return StopMatcher(stops)


def matcher(stops: Sequence[str]) -> StopMatcher:
    """The automaton for `stops`, built once: the attempts and choices of a request share it."""
    return _matcher(tuple(stops))


class StopScanner:
    """One text (a choice of a stream, or a whole answer) fed through the automaton, piece by piece.

    Holds back only what could still be the start of a stop, or the stop found while a stop starting
    earlier (or starting there and earlier in the list) could still complete.
    """

    __slots__ = ("m", "include", "buf", "state", "best_at", "best", "found")

    def __init__(self, stops: Sequence[str] | StopMatcher, include: bool) -> None:
        self.m = stops if isinstance(stops, StopMatcher) else matcher(stops)
        self.include = include
        self.buf = ""  # text received and not yet given out
        self.state = 0
        self.best_at = -1  # in `buf`: where the best stop found so far starts (-1: none)
        self.best = -1  # its index in the list
        self.found = -1  # the stop reached (index in the list), once `feed` said so

    def feed(self, text: str, final: bool = True) -> tuple[str, bool]:
        """(text safe to send now, whether a stop was reached). `final`: decide with what this piece
        completes (a stream's chunk); otherwise a stop still in doubt waits for the next piece."""
        m = self.m
        goto, fail, depth, out, below, stops, starts = m.goto, m.fail, m.depth, m.out, m.below, m.stops, m.starts
        base = len(self.buf)
        buf = self.buf + text
        state, best_at, best = self.state, self.best_at, self.best
        j, end = 0, len(text)
        marked: bytes | None = None  # ASCII `text` with 0 where a stop can start, made on first need
        decided = False
        while j < end:
            if state == 0 and best_at < 0:
                if marked is None:
                    if text.isascii():
                        if starts.isdisjoint(text):  # most pieces hold no character a stop begins with
                            j = end
                            break
                        marked = text.encode().translate(m.marks)
                    elif m.latin:
                        # One byte per character, `?` for those beyond latin-1 (a false start at most, when a
                        # stop begins with `?`: the automaton steps over it).
                        marked = text.encode("latin-1", "replace").translate(m.marks)
                    else:
                        marked = b""
                if marked:
                    j = marked.find(0, j)
                else:
                    first = -1
                    for c in m.firsts:
                        at = text.find(c, j, end if first < 0 else first)
                        if at >= 0:
                            first = at
                    j = first
                if j < 0:
                    j = end
                    break
            c = text[j]
            while True:
                nxt = goto[state].get(c)
                if nxt is not None:
                    state = nxt
                    break
                if state == 0:
                    break
                state = fail[state]
            j += 1
            i = out[state]
            if i >= 0:
                at = base + j - len(stops[i])
                if best_at < 0 or at < best_at or (at == best_at and i < best):
                    best_at, best = at, i
            if best_at >= 0:
                span = base + j - best_at
                d = depth[state]
                if d < span or (d == span and below[state] >= best):
                    decided = True  # nothing under way can start earlier, or there and earlier in the list
                    break
        if best_at >= 0 and (decided or final):
            cut = best_at + (len(stops[best]) if self.include else 0)
            self.found = best
            self.buf, self.state, self.best_at, self.best = "", 0, -1, -1
            return buf[:cut], True
        keep = len(buf) - depth[state]
        if best_at >= 0:
            keep = min(keep, best_at)
            best_at -= keep
        self.buf, self.state, self.best_at, self.best = buf[keep:], state, best_at, best
        return buf[:keep], False

    def flush(self) -> tuple[str, bool]:
        """The end of the text: what is held back, cut at a stop still in doubt (then True)."""
        if self.best_at >= 0:
            return self.feed("", final=True)
        out, self.buf, self.state = self.buf, "", 0
        return out, False


class Folded:
    """Tokens the client got without a chunk of their own: upstream chunks whose text a stop scanner held
    back whole (it might have begun a stop) and sent later, inside another chunk. A resumed stream counts
    what it sent by its chunks (gateway/path/relay.py), these added; of one choice, the only kind resumed."""

    __slots__ = ("tokens", "held")

    def __init__(self) -> None:
        self.tokens = 0  # held back, then sent
        self.held = 0  # held back and not sent yet: never the client's if the stream breaks now

    def scanned(self, text: str, safe: str) -> None:
        """One upstream chunk's `text` through a stop scanner, of which `safe` goes out now."""
        if safe:
            if self.held:
                self.tokens += self.held
                self.held = 0
        elif text:
            self.held += 1


def find_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """The earliest-starting stop sequence in `text` (position, sequence); the first in the list on a tie."""
    if not any(stops):
        return None
    scanner = StopScanner(stops, include=False)
    sent, stopped = scanner.feed(text)
    return (len(sent), scanner.m.stops[scanner.found]) if stopped else None


__all__ = ["Folded", "StopMatcher", "StopScanner", "find_stop", "matcher"]
