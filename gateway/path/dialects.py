"""The client-facing dialects: same request and Completion, different error shapes, and each route's own
defaults and bounds (`amend`, on a decoded completion request) and stream usage (`usage_last`).

openai  /v1/completions, /inference/v1/completions (Fireworks clients: usage on a stream's last chunk), and
        their chat routes; {"error": {"message", "type", "param", "code"}} with OpenAI's status codes
sgp     /v4/beta/completions (seed 003, a FastAPI service), /v4/beta/chat/completions; top_logprobs 0..20
pais    /api/v1/compatibility/openai/v1/[chat/]completions (seed 004): 422 {"detail": [{"loc", "msg", "type"}]} for
        bad fields, 404 "Unknown model endpoint" (an unknown alias, or an upstream that does not serve the
        model), 400 "...not ready"; temperature 0 unless sent, max_tokens >= 1, a non-empty stop list
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
import re2

from wire.errors import (
    GatewayError,
    InvalidRequestError,
    ModelNotFoundError,
    ProviderUnavailableError,
    shown,
)
from wire.schema import BodyError, CompletionRequest, encode

# msgspec's messages quote the client's own keys (an unknown field's name is the client's text, as long as
# the body allows), so they are parsed on RE2, linear in the text. On Python's `re`, `_AT` over a key made
# of repeated " - at `$[" cost the square of its length: 72 KB took a second of the event loop.
_UNKNOWN: Final[Any] = re2.compile(r"Object contains unknown field `([^`]+)`")
_MISSING: Final[Any] = re2.compile(r"Object missing required field `([^`]+)`")
_AT: Final[Any] = re2.compile(r"(?s)^(.*) - at `\$((?:\.[A-Za-z_][A-Za-z0-9_]*|\[[^\]]*\])*)`$")
_SEGMENT: Final[Any] = re2.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+|\.\.\.)\]")
# The messages of msgspec's that quote a value the client sent, whole (one outside an enum, an unknown tag of a
# tagged union): cut as any quoted client text.
_QUOTED: Final[Any] = re2.compile(r"(?s)^(Invalid (?:enum )?value) '(.*)'$")


def _path(path: str) -> list[str | int]:
    out: list[str | int] = []
    for name, index in _SEGMENT.findall(path):
        out.append(name if name else (int(index) if index.isdigit() else index))
    return out


def _label(loc: list[str | int]) -> str:
    """A path as the message names it, list indices kept (`messages[2].content`): the `param` leaves them out,
    and a client needs them to find the one bad message of a long conversation."""
    out = ""
    for p in loc:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p != "...":
            out += f".{p}" if out else p
    return out


class RequestError(InvalidRequestError):
    """A request body that failed decoding; `loc` is the JSON path, for FastAPI-style dialects."""

    def __init__(self, message: str, param: str | None, loc: list[str | int], kind: str) -> None:
        super().__init__(message, param=param, code=kind)
        self.loc = loc


def unknown_field(name: str, loc: list[str | int] | None = None) -> RequestError:
    """A field the request schema does not have, named as the client sent it (`loc`: its path, else the name),
    each name cut as errors quote a client's text: a name may be as long as the body."""
    name = shown(name)
    at: list[str | int] = [shown(p) if isinstance(p, str) else p for p in loc] if loc else [name]
    return RequestError(f"Unrecognized request argument supplied: {name}", name, at, "unknown_parameter")


def decode_error(exc: msgspec.DecodeError | msgspec.ValidationError) -> RequestError:
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        at = _AT.match(text)
        problem, where = (at.group(1), _path(at.group(2))) if at else (text, [])
        m = _UNKNOWN.match(problem)
        if m:
            loc = [*where, m.group(1)]
            name = ".".join(str(p) for p in loc if isinstance(p, str) and p != "...")
            return unknown_field(name, loc)
        m = _MISSING.match(problem)
        if m:
            loc = [*where, m.group(1)]
            name = ".".join(str(p) for p in loc if isinstance(p, str) and p != "...")
            return RequestError(f"Missing required parameter: '{_label(loc)}'", name, loc, "missing_required_parameter")
        param = ".".join(str(p) for p in where if isinstance(p, str) and p != "...") or None
        label = _label(where) or "request body"
        m = _QUOTED.match(problem)
        if m:
            problem = f"{m.group(1)} '{shown(m.group(2))}'"
        return RequestError(f"Invalid value for '{label}': {problem}", param, where, "invalid_value")
    if isinstance(exc, BodyError):
        return RequestError(exc.message, exc.param, [exc.param] if exc.param else [], exc.kind)
    return RequestError(
        "We could not parse the JSON body of your request: it must be a JSON object", None, [], "invalid_json"
    )


def _refused(field: str, bound: str) -> InvalidRequestError:
    """A value the route's own schema bounds, as msgspec words a bound it checks (`invalid_value`)."""
    return InvalidRequestError(f"Invalid value for '{field}': Expected {bound}", param=field, code="invalid_value")


class Dialect:
    name: str = "openai"
    # Whether `amend` does anything: a route that takes its request as decoded pays one attribute test.
    amends: bool = False
    # A stream's usage rides on its last chunk when the client did not ask for it (`stream_options`).
    usage_last: bool = False

    def amend(self, req: CompletionRequest) -> None:
        """The route's own defaults and bounds on a decoded completion request, before it is normalized (and
        before the cache key, the limits and the routing read it); raises the refusal of a bound."""

    def error(self, exc: GatewayError) -> tuple[int, bytes]:
        body = {
            "error": {
                "message": exc.message,
                "type": exc.type,
                "param": exc.param,
                "code": exc.code,
            }
        }
        return exc.status, encode(body)


class FastAPIDialect(Dialect):
    """Validation failures as FastAPI's 422 `{"detail": [...]}`, everything else as `{"detail": "..."}`."""

    not_found: str = "Unknown model endpoint requested."
    not_ready: str = "Invalid model endpoint specified or model endpoint not ready."

    def error(self, exc: GatewayError) -> tuple[int, bytes]:
        detail: Any
        # FastAPI answers every body it cannot validate (bad JSON included) with 422 and a location.
        if isinstance(exc, RequestError) or (isinstance(exc, InvalidRequestError) and exc.param is not None):
            loc = exc.loc if isinstance(exc, RequestError) else (exc.param or "").split(".")
            detail = [{"loc": ["body", *loc], "msg": exc.message, "type": exc.code or "value_error"}]
            return 422, encode({"detail": detail})
        if isinstance(exc, ModelNotFoundError) or (exc.status == 404 and exc.code == "model_not_found"):
            # An upstream that does not serve the model answers like an unknown alias: PAIS's 404.
            return 404, encode({"detail": f"{self.not_found} {exc.message}"})
        if isinstance(exc, ProviderUnavailableError):
            return 400, encode({"detail": f"{self.not_ready} {exc.message}"})
        return exc.status, encode({"detail": exc.message})


class UsageLastDialect(Dialect):
    """OpenAI's errors, and a stream's usage on its last chunk unasked: Fireworks' stream (seed 001)."""

    usage_last = True


class SGPDialect(FastAPIDialect):
    name = "sgp"
    amends = True

    def amend(self, req: CompletionRequest) -> None:
        # Seed 003: "An integer between 0 and 20"; wider counts are the decoder's and each provider's to bound.
        if req.top_logprobs is not None and req.top_logprobs > 20:
            raise _refused("top_logprobs", "`int` <= 20")


class PAISDialect(FastAPIDialect):
    name = "pais"
    amends = True

    def amend(self, req: CompletionRequest) -> None:
        # Seed 004's CompletionsRequestPayload: temperature "default: 0" (a client that sends none expects
        # greedy decoding, not the upstream's own default), max_tokens "minimum: 1", stop "minItems: 1".
        # n's "minimum: 1" and temperature's bounds are the decoder's already.
        if req.temperature is None:
            req.temperature = 0.0
        if req.max_tokens is not None and req.max_tokens < 1:
            raise _refused("max_tokens", "`int` >= 1")
        if isinstance(req.stop, list) and not req.stop:
            raise _refused("stop", "`array` of length >= 1")


OPENAI: Final = Dialect()
USAGE_LAST: Final = UsageLastDialect()
SGP: Final = SGPDialect()
PAIS: Final = PAISDialect()
