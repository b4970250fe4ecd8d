"""Folding the dialects' alias names into canonical fields, and the checks msgspec cannot express.

After `normalize`, adapters read only canonical fields (`max_tokens`, `stop` as a list, `logprobs` as an
int count or None). It also refuses, before routing, model names, headers and nesting a hostile client
could use against the gateway or an upstream. Precedence of the aliases: docs/architecture.md. A chat
request's own checks come first (gateway/path/chat_request.py `normalize_chat`), which then calls this.
"""

from __future__ import annotations

import operator
import re
from typing import Final

import msgspec

from gateway.config import CapsConfig
from gateway.emulation.planning import GUIDED_CHOICE_CHARS, GUIDED_CHOICES
from gateway.path.dialects import unknown_field
from gateway.path.token_ids import check_id_lists, check_prompt
from gateway.path.unrendered import unrendered
from providers.registry import credential_headers
from wire.chat import ChatRequest
from wire.errors import InvalidRequestError, shown
from wire.schema import FREE_FORM, CacheSalt, CompletionRequest, check_depth, no_chat_template

MAX_CHOICES: Final = 128
# Longest model string a client may send; real ids (Bedrock ARNs, Fireworks paths) stay well under it.
MAX_MODEL_CHARS: Final = 256
# Headers a client may add upstream; servers commonly refuse a request with more than 100 in all.
MAX_EXTRA_HEADERS: Final = 64
_DEFAULT_CAPS: Final = CapsConfig()
_CONTAINERS: Final = (dict, list)
_free_form: Final = operator.attrgetter(*FREE_FORM)
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 token
_HEADER_VALUE: Final = re.compile(r"[\t\x20-\x7e\x80-\xff]*")  # no CR, LF, NUL or other controls
# Headers the client may not set upstream: they carry the gateway's credentials (every registered provider
# kind's `credential_headers`, whichever provider the request goes to), or they are hop-by-hop and
# framing headers that belong to the gateway's own connection (an `Expect` or a `Transfer-Encoding` from a
# client would change how the upstream reads the request and answers on a pooled connection). Any name
# starting `proxy-` is refused too (`_refused_header`).
_NOT_THE_CLIENTS: Final = frozenset(
    {
        # credentials of any HTTP API
        "authorization",
        "cookie",
        # framing and hop-by-hop (RFC 9110 7.6.1, RFC 9112)
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "http2-settings",
        "expect",
        # the body and answer encodings are the gateway's: it writes the one and decodes the other
        "content-type",
        "content-encoding",
        "accept-encoding",
    }
)
FORBIDDEN_HEADERS: Final = _NOT_THE_CLIENTS | credential_headers()


_EXTRA_FORBIDDEN: Final = (
    # A prompt's template is the server's configuration, never a tenant's: a Jinja template sent with a request
    # can keep a shared server's CPU busy for as long as it likes (CVE-2025-61620), and Ollama's
    # `/api/generate` renders a Go `template` sent with one (`printf` alone can ask for a gigabyte).
    "chat_template",
    "template",
    "model",
    "prompt",
    "stream",
    "stream_options",
    "n",
    "best_of",
    "max_tokens",
    "max_completion_tokens",
    "max_new_tokens",
)


def invalid_value(message: str, param: str) -> InvalidRequestError:
    """The 400 for a bad value of the field `param`."""
    return InvalidRequestError(message, param=param, code="invalid_value")


def _refused_header(name: str) -> bool:
    # CGI/WSGI-style servers (and proxies that map names to variables) read `x_api_key` as `x-api-key`: an
    # underscore spelling is refused as its `-` spelling is.
    lowered = name.lower().replace("_", "-")
    # credential_headers() again: a kind registered after this module was imported counts too.
    return lowered in FORBIDDEN_HEADERS or lowered.startswith("proxy-") or lowered in credential_headers()


def check_model(model: str) -> None:
    """Refuse a model string that could not be routed safely: it is echoed in a response header and a log
    line, matched against key globs, and may become part of an upstream URL."""
    if model in _MODELS_OK:  # nearly every request names a model asked for before: one probe
        return
    if not model or len(model) > MAX_MODEL_CHARS or not model.isprintable():
        raise invalid_value(
            f"'model' must be 1 to {MAX_MODEL_CHARS} printable characters (no control or format characters)",
            "model",
        )
    # They end a URL path (`?`, `#`) or act as a path separator on some servers (a backslash): never in a model id.
    if "?" in model or "#" in model or "\\" in model:
        raise invalid_value("'model' may not contain '?', '#' or a backslash", "model")
    if "/." in "/" + model and any(seg in (".", "..") for seg in model.split("/")):
        raise invalid_value("'model' may not contain '.' or '..' segments", "model")
    if len(_MODELS_OK) >= _MODELS_MAX:
        _MODELS_OK.clear()  # client-chosen model names cannot grow it
    _MODELS_OK.add(model)


# Model strings `check_model` passed: emptied when full.
_MODELS_OK: Final[set[str]] = set()
_MODELS_MAX: Final = 1024


def _check_guided(req: CompletionRequest) -> None:
    guided = [
        name
        for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
        if getattr(req, name) is not None
    ]
    if len(guided) > 1:
        raise invalid_value(f"only one structured-output constraint may be set, got {', '.join(guided)}", guided[1])
    if guided and req.response_format is not None and req.response_format.get("schema") is not None:
        raise invalid_value(f"'response_format' with a schema conflicts with '{guided[0]}'", "response_format")
    choices = req.guided_choice
    if choices is not None:
        if not choices:
            raise invalid_value("'guided_choice' must not be empty", "guided_choice")
        # Whichever provider serves the request, the gateway may check the answer itself (a failover to a kind
        # that emulates it) or build the server's grammar from the choices: both held to one bound.
        if len(choices) > GUIDED_CHOICES or sum(map(len, choices)) > GUIDED_CHOICE_CHARS:
            raise invalid_value(
                f"'guided_choice' may have at most {GUIDED_CHOICES} entries of at most {GUIDED_CHOICE_CHARS} "
                "characters together",
                "guided_choice",
            )


# The fields most requests leave unset whose checks and folds `normalize` skips when none is set: the token
# limit's and stops' other names, the logprobs' forms, `best_of`, `stream_options`, the structured-output and
# free-form fields, `inference_timeout`, the escape hatches and the lists of token ids; and what a completion
# sends beside its prompt (`unrendered`, from these and its `suffix` and `images`, none of which the common
# request has: a count a client sent under its held name is replaced there too).
_RARE: Final = tuple(
    dict.fromkeys(
        (
            "suffix",
            "images",
            "unrendered",
            "max_new_tokens",
            "max_completion_tokens",
            "stop_sequences",
            "logprobs",
            "top_logprobs",
            "return_token_log_probs",
            "best_of",
            "stream_options",
            "guided_json",
            "guided_regex",
            "guided_choice",
            "guided_grammar",
            "inference_timeout",
            "inference_extra_headers",
            "stop_token_ids",
            "allowed_token_ids",
            "logit_bias",
            "store",
            "continue_final_message",
            "add_generation_prompt",
            *FREE_FORM,
        )
    )
)
_rare: Final = operator.attrgetter(*_RARE)
_NONE_SET: Final = (None,) * len(_RARE)


def _bounded_stops(stop: list[str] | None, name: str, caps: CapsConfig) -> list[str] | None:
    # Whichever provider serves the request, the gateway may have to find these in the text itself (stops
    # beyond a provider's count, a failover to one that takes fewer): each is held to a pattern's bound.
    if stop and max(map(len, stop)) > caps.pattern_chars:
        raise invalid_value(f"'{name}' may hold sequences of at most {caps.pattern_chars} characters", name)
    return stop or None


def _check_choices(n: int, n_prompts: int) -> None:
    if n * n_prompts > MAX_CHOICES:
        raise invalid_value(f"at most {MAX_CHOICES} choices per request (prompts x n)", "n")


def refuse_held(req: CompletionRequest, names: tuple[str, ...]) -> None:
    """An unknown field for the first of `names` set: fields held under a leading-space name (by which a client
    sent it) that no client of this route may set."""
    for name in names:
        if getattr(req, name) is not None:
            raise unknown_field(f" {name}")


def normalize(req: CompletionRequest, caps: CapsConfig = _DEFAULT_CAPS) -> CompletionRequest:
    """Canonicalize in place and return the same object (one decode, no copies)."""
    check_model(req.model)
    prompt = req.prompt
    n_prompts = (
        1 if isinstance(prompt, str) else check_prompt(prompt, caps.prompt_token_ids, MAX_CHOICES)
    )  # one text, the common case: no call
    if _rare(req) == _NONE_SET:
        # The common request: of the checks below, only the stops' bound and the choice count apply (one C
        # call tells; the full pass costs several times the request's decode).
        stop = req.stop
        if stop is not None:
            req.stop = _bounded_stops([stop] if isinstance(stop, str) else stop, "stop", caps)
        _check_choices(req.n or 1, n_prompts)
        return req

    if req.__class__ is not ChatRequest:
        # Chat's prefill fields live on the shared struct under names no client means to send (a leading
        # space); one sent to a completion is an unknown field, as it would be without them.
        refuse_held(req, ("continue_final_message", "add_generation_prompt"))

    limit: int | None = None
    for name in ("max_tokens", "max_new_tokens", "max_completion_tokens"):
        value = getattr(req, name)
        if value is None:
            continue
        if limit is not None and value != limit:
            raise invalid_value(f"'{name}' ({value}) disagrees with the token limit already given ({limit})", name)
        limit = value
    req.max_tokens, req.max_new_tokens, req.max_completion_tokens = limit, None, None

    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    if req.stop_sequences is not None:
        if stop is not None and stop != req.stop_sequences:
            raise invalid_value("'stop_sequences' disagrees with 'stop'", "stop_sequences")
        stop = req.stop_sequences
    req.stop = _bounded_stops(stop, "stop_sequences" if req.stop_sequences is not None else "stop", caps)
    req.stop_sequences = None

    lp = req.logprobs
    count: int | None
    if isinstance(lp, bool):
        if not lp and req.top_logprobs:
            raise invalid_value("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
        count = (req.top_logprobs or 0) if lp else None
    else:
        if lp is not None and req.top_logprobs is not None and req.top_logprobs != lp:
            raise invalid_value("'top_logprobs' disagrees with the integer 'logprobs'", "top_logprobs")
        count = lp
    if count is None and req.top_logprobs is not None:
        raise invalid_value("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
    if count is None and req.return_token_log_probs:
        count = 0
    req.logprobs, req.top_logprobs, req.return_token_log_probs = count, None, None

    n = req.n or 1
    if req.best_of is not None:
        if req.best_of < n:
            raise invalid_value("'best_of' must be greater than or equal to 'n'", "best_of")
        if req.stream:
            raise invalid_value("'best_of' cannot be used with 'stream'", "best_of")
    _check_choices(max(n, req.best_of or 0), n_prompts)

    if req.stream_options is not None and not req.stream:
        raise invalid_value("'stream_options' is only allowed when 'stream' is true", "stream_options")

    # Most requests set none: four attribute reads instead of a comprehension (a call of its own on 3.11).
    if (
        req.guided_json is not None
        or req.guided_regex is not None
        or req.guided_choice is not None
        or (req.guided_grammar is not None)
    ):
        _check_guided(req)

    if isinstance(req.inference_timeout, str):
        try:
            seconds = float(req.inference_timeout)
        except ValueError:
            raise invalid_value("'inference_timeout' must be a number of seconds", "inference_timeout") from None
        if not seconds > 0:
            raise invalid_value("'inference_timeout' must be greater than 0", "inference_timeout")
        req.inference_timeout = seconds

    if req.inference_extra_headers:
        if len(req.inference_extra_headers) > MAX_EXTRA_HEADERS:
            raise invalid_value(
                f"'inference_extra_headers' may set at most {MAX_EXTRA_HEADERS} headers", "inference_extra_headers"
            )
        for header, value in req.inference_extra_headers.items():
            if _refused_header(header):
                raise invalid_value(
                    f"'inference_extra_headers' may not set '{shown(header)}'", "inference_extra_headers"
                )
            # Sent as written on the upstream's wire: a name must be an HTTP token and a value one line of
            # latin-1 text, or a client could smuggle a header or a second request.
            if not _HEADER_NAME.fullmatch(header) or not _HEADER_VALUE.fullmatch(value):
                raise invalid_value(
                    f"'inference_extra_headers' has an invalid header {shown(header)!r}: names are HTTP tokens and "
                    "values one line of latin-1 text",
                    "inference_extra_headers",
                )
    if req.stop_token_ids is not None or req.allowed_token_ids is not None or req.logit_bias is not None:
        check_id_lists(req, caps.param_token_ids)
    if req.chat_template_kwargs is not None:
        no_chat_template(req.chat_template_kwargs)
    if req.store is False:
        req.store = None  # storing nothing is what every provider does without the field: taken everywhere
    free = _free_form(req)
    if free.count(None) != len(FREE_FORM):  # one C call when none is set, as in most requests
        for field, value in zip(FREE_FORM, free, strict=True):
            if isinstance(value, _CONTAINERS):
                check_depth(value, caps.json_depth, field)
    if req.inference_extra_params:
        # `stream_options` too: the gateway asks every stream for its usage, which rate limits and budgets
        # settle on; a client turning it off would be billed for nothing. The choice count and token limit
        # likewise: admission reserves tokens and the emulation and choice caps are computed from the
        # request's own fields, which the escape hatch must not quietly outgrow.
        for key in _EXTRA_FORBIDDEN:
            if key in req.inference_extra_params:
                raise invalid_value(f"'inference_extra_params' may not set '{key}'", "inference_extra_params")
        no_chat_template(req.inference_extra_params.get("chat_template_kwargs"), "inference_extra_params.")
        salt = req.inference_extra_params.get("cache_salt")
        if salt is not None:
            # Sent where the top-level field goes, so held to the same rule (an engine's prefix-cache partition).
            try:
                msgspec.convert(salt, CacheSalt)
            except msgspec.ValidationError:
                raise invalid_value(
                    "'inference_extra_params.cache_salt' must be 1 to 256 characters of A-Z a-z 0-9 . _ : / + = -, "
                    "like the top-level 'cache_salt'",
                    "inference_extra_params.cache_salt",
                ) from None
    if req.__class__ is not ChatRequest:  # normalize_chat counts a chat's, with its messages'
        req.unrendered = unrendered(req, len(req.images or ()), caps.image_tokens)
    return req
