"""Streamed emulation: the client's stops found across chunk borders (`StopScanner`), sub-streams relayed
in order as one stream, and a buffered answer cut into chunks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from gateway.emulation.combine import _add, find_stop
from gateway.emulation.planning import Emulation, SubStream
from providers.base import CallContext
from wire.schema import Choice, Completion, CompletionRequest, Usage


def _borders(s: str) -> list[int]:
    """KMP failure function: for each prefix s[:i+1], the length of its longest proper border."""
    fail = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return fail


class StopScanner:
    """Streams text through, holding back only what could still be the start of a stop sequence.

    Linear in the text: per stop, a KMP automaton carries how much of the stop the text so far ends with
    (that is what must be held back), fed only the new text, and skipping with `str.find` while nothing
    is matched. Rescanning the held text on every chunk would be quadratic in a long partial match.
    """

    def __init__(self, stops: Sequence[str], include: bool) -> None:
        self.stops = [s for s in stops if s]
        self.include = include
        self.buf = ""
        self._fail = [_borders(s) for s in self.stops]
        self._matched = [0] * len(self.stops)

    def _advance(self, i: int, text: str) -> bool:
        """Feed `text` to stop i's automaton; whether the stop is now complete."""
        s, fail, k = self.stops[i], self._fail[i], self._matched[i]
        j, end = 0, len(text)
        while j < end:
            if k == 0:
                j = text.find(s[0], j)
                if j < 0:
                    break
            c = text[j]
            while k and s[k] != c:
                k = fail[k - 1]
            if s[k] == c:
                k += 1
            j += 1
            if k == len(s):
                self._matched[i] = k
                return True
        self._matched[i] = k
        return False

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to send now, whether a stop sequence was reached)."""
        self.buf += text
        complete = False
        for i in range(len(self.stops)):
            complete = self._advance(i, text) or complete
        if complete:
            # The earliest-starting stop within the text held and this chunk (as `find_stop` everywhere).
            hit = find_stop(self.buf, self.stops)
            assert hit is not None
            cut = hit[0] + (len(hit[1]) if self.include else 0)
            out, self.buf = self.buf[:cut], ""
            return out, True
        hold = max(self._matched, default=0)
        out = self.buf[: len(self.buf) - hold]
        self.buf = self.buf[len(self.buf) - hold :]
        return out, False

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


async def stream(
    em: Emulation,
    req: CompletionRequest,
    ctx: CallContext,
    opens: Sequence[SubStream],
) -> AsyncGenerator[Completion, None]:
    """Merge the already-opened sub-streams into one, re-indexing, echoing and enforcing stops.

    `opens[k]` is the k-th sub-call's stream (prompt k // fan_n, choice k % fan_n).
    """
    queue: asyncio.Queue[tuple[int, Completion | None | BaseException]] = asyncio.Queue()

    async def pump(k: int, opened: SubStream) -> None:
        try:
            c = opened.first
            while c is not None:
                await queue.put((k, c))
                c = await anext(opened.chunks, None)
            await queue.put((k, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            await queue.put((k, exc))

    pumps = [asyncio.ensure_future(pump(k, o)) for k, o in enumerate(opens)]
    scanners: dict[int, StopScanner] = {}
    echoed: set[int] = set()
    done: set[int] = set()
    usage: Usage | None = None
    live = len(opens)
    try:
        while live:
            k, item = await queue.get()
            if item is None:
                live -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            usage = _add(usage, item.usage)
            p_index, j = divmod(k, em.fan_n)
            out: list[Choice] = []
            for ch in item.choices:
                index = p_index * em.n + (j if em.fan_n > 1 else ch.index)
                if index in done:
                    continue
                text, finish, lp = ch.text, ch.finish_reason, ch.logprobs
                if em.echo and index not in echoed:
                    echoed.add(index)
                    prompt = em.prompts[p_index]
                    text = (prompt if isinstance(prompt, str) else "") + text
                if em.stops is not None:
                    scanner = scanners.setdefault(index, StopScanner(em.stops, em.include_stop))
                    safe, stopped = scanner.feed(ch.text)
                    if em.echo and text != ch.text:
                        safe = text[: len(text) - len(ch.text)] + safe
                    if stopped:
                        finish = "stop"
                    elif finish is not None:
                        safe += scanner.flush()
                    if safe != text:
                        lp = None  # the chunk's token logprobs no longer describe its text
                    text = safe
                if finish is not None:
                    done.add(index)
                if text or finish is not None:
                    out.append(Choice(text, index, lp, finish))
            if out:
                yield ctx.completion(out)
            if (
                em.stops is not None
                and done
                and all(p * em.n + jj in done for p in range(len(em.prompts)) for jj in range(em.n))
            ):
                break  # every choice has stopped: no need to read (or pay for) the rest
        if usage is not None:
            yield ctx.completion([], usage)
    finally:
        for p in pumps:
            p.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


def to_chunks(c: Completion) -> list[Completion]:
    """A validated answer as stream chunks: one per choice, the last carrying the usage."""
    chunks = [
        Completion(id=c.id, created=c.created, model=c.model, choices=[ch], system_fingerprint=c.system_fingerprint)
        for ch in c.choices
    ]
    if chunks:
        chunks[-1].usage = c.usage
    return chunks
