"""Streamed emulation: the client's stops found across chunk borders (a `stops.StopScanner` per choice),
sub-streams relayed in order as one stream, and a buffered answer cut into chunks.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

import msgspec

from gateway.emulation.combine import _scan, summed
from gateway.emulation.merge import merged, own_choice
from gateway.emulation.planning import Emulation, SubStream
from gateway.emulation.stops import Folded, StopScanner
from providers.base import CallContext
from wire.schema import Choice, Completion, CompletionRequest, Usage


async def stream(
    em: Emulation,
    req: CompletionRequest,
    ctx: CallContext,
    opens: Sequence[SubStream],
    into: Folded | None = None,
) -> AsyncGenerator[Completion, None]:
    """Merge the already-opened sub-streams into one, re-indexing, echoing and enforcing stops; the chunks
    the stops held back and sent inside a later one counted `into`.

    `opens[k]` is the k-th sub-call's stream (prompt k // fan_n, choice k % fan_n).
    """
    into = into if into is not None else Folded()
    scanners: dict[int, StopScanner] = {}
    echoed: set[int] = set()
    done: set[int] = set()
    cut = False  # a choice the stops ended while its upstream still generates it
    usages: dict[int, Usage] = {}  # each call's latest: an engine may repeat a running total on every chunk
    asked = 1 if em.fan_n > 1 else em.n  # the choices each call asked for
    async with aclosing(merged(opens)) as chunks:
        async for k, item in chunks:
            if item.usage is not None:
                usages[k] = item.usage
            p_index, j = divmod(k, em.fan_n)
            out: list[Choice] = []
            for ch in item.choices:
                own_choice(ch.index, asked)
                index = p_index * em.n + (j if em.fan_n > 1 else ch.index)
                if index in done:
                    continue
                text, finish, lp = ch.text, ch.finish_reason, ch.logprobs
                ids, reason = ch.token_ids, ch.stop_reason
                if em.echo and index not in echoed:
                    echoed.add(index)
                    prompt = em.prompts[p_index]
                    text = (prompt if isinstance(prompt, str) else "") + text
                if em.matcher is not None:
                    scanner = scanners.get(index)
                    if scanner is None:
                        scanner = scanners[index] = StopScanner(em.matcher, em.include_stop)
                    safe, stopped = await _scan(scanner, ch.text)
                    if em.echo and text != ch.text:
                        safe = text[: len(text) - len(ch.text)] + safe
                    if not stopped and finish is not None:
                        rest, stopped = scanner.flush()
                        safe += rest
                    if stopped:
                        cut = cut or finish is None
                        finish = "stop"
                    if safe != text:
                        # The chunk's token logprobs, ids and stop reason no longer describe its text.
                        lp, ids, reason = None, None, None
                        into.scanned(ch.text, safe)  # only here: a chunk the stops left as it was holds nothing
                    text = safe
                if finish is not None:
                    done.add(index)
                if text or finish is not None:
                    # Replaced, not rebuilt: an engine's token-native fields (token_ids, stop_reason...) are kept.
                    out.append(
                        msgspec.structs.replace(
                            ch,
                            text=text,
                            index=index,
                            logprobs=lp,
                            finish_reason=finish,
                            token_ids=ids,
                            stop_reason=reason,
                        )
                    )
            if out:
                yield ctx.completion(out)
            if (
                cut
                and em.stops is not None
                and all(p * em.n + jj in done for p in range(len(em.prompts)) for jj in range(em.n))
            ):
                # Every choice has stopped, one while its upstream still generates: no need to read (or pay
                # for) the rest. When the upstreams ended them all, what follows is their usage: read on.
                break
    usage = summed(usages.values())
    if usage is not None:
        yield ctx.completion([], usage)


def to_chunks(c: Completion) -> list[Completion]:
    """A validated answer as stream chunks: one per choice, the last carrying the usage."""
    chunks = [
        Completion(id=c.id, created=c.created, model=c.model, choices=[ch], system_fingerprint=c.system_fingerprint)
        for ch in c.choices
    ]
    if chunks:
        chunks[-1].usage = c.usage
    return chunks
