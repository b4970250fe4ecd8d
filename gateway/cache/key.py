"""The cache key: a canonical encoding of everything that decides the answer, and its SHA-256.

It is computed after `gateway.path.request.normalize`, so the dialects' names for one field
(`max_new_tokens`, `max_tokens`, `max_completion_tokens`; `stop_sequences` and `stop`; boolean `logprobs`)
are already one field. The request struct is encoded in its declared field order (a change to that order
needs a new entry VERSION) with object keys sorted at every depth, so neither the order fields arrived in
nor the order inside `inference_extra_params` changes the key, while every field the client set does; what the
gateway makes of them (`unrendered`, normalize_chat's marks on a chat's messages) is left out. The scope is
prefixed; every key ends with `targets_of`'s digest of where the model routes (docs/cache.md). `stream`,
`stream_options` and `inference_timeout` say how the answer is delivered, not what it is: left out, so a
buffered request and a streamed one share an entry. The memory store and in-flight requests are keyed by these
bytes; a Redis name by their SHA-256.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Final

import msgspec

from gateway.cache.entry import VERSION
from gateway.config import ProviderConfig
from wire.chat import ChatRequest
from wire.schema import CompletionRequest

# `cache_key`'s, of a request without its delivery fields: MessagePack, not JSON (the same canonical form, a
# quarter cheaper to make and shorter: nothing escaped, numbers in binary).
packed = msgspec.msgpack.Encoder(order="deterministic").encode
# MessagePack has no integer past 64 bits, which a free-form field (`inference_extra_params`, a schema)
# may hold: such a request is keyed by its deterministic JSON instead, behind a byte that never starts a
# MessagePack map, so no key of one form can equal a key of the other.
_json = msgspec.json.Encoder(order="deterministic").encode
_WIDE: Final = b"\xc1"
# What the gateway makes from a request's other fields, at its default. A chat sets a mark only beside an
# `unrendered` (thinking, calls and tool messages are sent beside the text), so one test finds them all.
_MADE: Final[dict[type, dict[str, object]]] = {
    CompletionRequest: {"unrendered": None},
    ChatRequest: {
        "unrendered": None,
        "thinking_back": False,
        "unanswered": None,
        "unreplied": None,
        "repeated": None,
        "open_calls": None,
    },
}


def canonical(req: CompletionRequest) -> bytes:
    """`req`'s canonical encoding: MessagePack, or JSON where it holds an integer MessagePack cannot."""
    if req.unrendered is not None:
        # Made from the request's other fields, which the key holds already: a second copy of its tools and
        # schemas would only lengthen every key (and a batch's, once per prompt).
        req = msgspec.structs.replace(req, **_MADE[req.__class__])
    try:
        return packed(req)
    except OverflowError:
        return _WIDE + _json(req)


_PREFIX: Final = f"gateway-cache/v{VERSION}\x00".encode()

# What the per-prompt keys of one request with a list of prompts may hold together, besides the prompts:
# each key repeats every other field, so a large free-form field sent with many short prompts would
# otherwise take (prompts x field) bytes. Past it the request bypasses the cache (docs/cache.md).
BATCH_KEYS_BYTES: Final = 4 * 1024 * 1024


def cache_key(req: CompletionRequest, scope: bytes, targets: bytes = b"") -> bytes:
    """`req` (normalized) in its canonical encoding, as the answer's identity, within `scope`, for the model it
    asks for routed to `targets` (`targets_of`)."""
    if req.stream is not None or req.stream_options is not None or req.inference_timeout is not None:
        req = msgspec.structs.replace(
            req, stream=None, stream_options=None, inference_timeout=None, **_MADE[req.__class__]
        )
    # After the encoding, which ends where it ends (MessagePack, or a JSON object), so no key of one set of
    # targets can be another's.
    return scope + canonical(req) + targets


def backend_of(provider: ProviderConfig) -> str:
    """What identifies the servers a provider's requests go to: its kind, its URLs (`base_url`, each deployment's),
    API version and region, as a digest (a URL may carry a credential; the provider's key is not in it). Its
    name, limits, timeouts, headers and keys are not: changing those leaves its answers serving. Nor are its
    replicas: copies of one engine serving one model, which a fleet adds and drains without changing answers."""
    deployments = sorted((d, c.base_url, c.api_version, c.name) for d, c in provider.deployments.items())
    what = (provider.kind, provider.base_url, provider.api_version, provider.region, deployments)
    return hashlib.sha256(packed(what)).hexdigest()[:32]


def targets_of(models: list[str], backends: Mapping[str, str]) -> bytes:
    """What the keys of a model asked for end with: a digest of the models it routes to (an alias's targets, in
    any order, any weight; a `vendor/model` name itself) and of each one's provider's servers (`backends`, per
    provider name: `backend_of`), so a reload that points it at other models or other servers does not serve
    their former answers."""
    named = sorted({f"{m}\x00{backends.get(m.partition('/')[0], '')}" for m in models})
    return b"\x00t" + hashlib.sha256("\n".join(named).encode("utf-8", "surrogatepass")).digest()[:16]


def digest(key: bytes) -> str:
    """The hex SHA-256 of a key with the entry version: a store name that carries no client text."""
    return hashlib.sha256(_PREFIX + key).hexdigest()


def model_tag(model: str) -> str:
    """A short digest of a model name, for store keys that must not carry client text."""
    tag = _TAGS.get(model)
    if tag is None:
        if len(_TAGS) >= _TAGS_MAX:
            _TAGS.clear()  # client-chosen model names cannot grow it
        tag = _TAGS[model] = hashlib.sha256(model.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return tag


_TAGS: Final[dict[str, str]] = {}
_TAGS_MAX: Final = 1024


__all__ = ["BATCH_KEYS_BYTES", "backend_of", "cache_key", "canonical", "digest", "model_tag", "packed", "targets_of"]
