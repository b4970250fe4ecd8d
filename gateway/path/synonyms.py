"""An error that names a field by its canonical name, renamed to the synonym the client sent.

`gateway.path.request.normalize` folds the dialects' names for one field into one (`max_new_tokens` and
`max_completion_tokens` into `max_tokens`, `stop_sequences` into `stop`, `top_logprobs` beside a boolean
`logprobs` into the integer `logprobs`), so the checks after it (a provider's limits, the token limits)
name the canonical field. A client of the Scale dialect that sent `max_new_tokens` is told about
`max_new_tokens`. Only an error answer pays for this: the body's top-level names are read again then.
"""

from __future__ import annotations

from typing import Final

import msgspec

from wire.errors import GatewayError

# The canonical name, and the names a client may have sent it under (the first one found is named).
_SENT_AS: Final[dict[str, tuple[str, ...]]] = {
    "max_tokens": ("max_new_tokens", "max_completion_tokens"),
    "stop": ("stop_sequences",),
    "logprobs": ("top_logprobs",),
}
_names = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode


def as_sent(exc: GatewayError, body: bytes) -> GatewayError:
    """`exc` naming the field as `body` named it; `exc` itself when it names no folded field."""
    synonyms = _SENT_AS.get(exc.param or "")
    if synonyms is None:
        return exc
    try:
        sent = _names(body)
    except (msgspec.DecodeError, RecursionError):
        return exc
    canonical = exc.param or ""
    if canonical in sent and (canonical != "logprobs" or bytes(sent[canonical]) not in (b"true", b"false")):
        return exc  # the client used this name itself (an integer `logprobs` is its own count)
    for name in synonyms:
        if name in sent:
            message = exc.message.replace(f"'{canonical}'", f"'{name}'")
            return exc.evolve(param=name, message=message)
    return exc


__all__ = ["as_sent"]
