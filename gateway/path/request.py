"""Folding the dialects' alias names into canonical fields, and the checks msgspec cannot express.

After `normalize`, adapters read only canonical fields (`max_tokens`, `stop` as a list, `logprobs` as an
int count or None). It also refuses, before routing, model names, headers and nesting a hostile client
could use against the gateway or an upstream. Precedence of the aliases: docs/architecture.md.
"""

from __future__ import annotations

import operator
import re
from typing import Final

import msgspec

from gateway.config import CapsConfig
from gateway.emulation.planning import GUIDED_CHOICE_CHARS, GUIDED_CHOICES
from gateway.path.dialects import decode_error, unknown_field
from gateway.path.echo import echoed
from gateway.path.token_ids import check_id_lists, check_prompt
from gateway.path.unrendered import NOTHING_BESIDE, chat_beside, image_parts, unrendered
from providers.registry import credential_headers
from wire.chat import CHAT_SHAPES, AssistantMessage, ChatRequest, ToolMessage, UserMessage, bound_conversation, render
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


def _bad(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code="invalid_value")


def _empty_id(at: str, param: str) -> InvalidRequestError:
    # A tool message names the call it answers by its id, and an empty one names none: Gemini's adapter, which
    # pairs results with calls by id, would pair it with any other call left without one, and Anthropic and
    # Bedrock refuse it as a 400 of theirs. Refused here, in the client's terms, before any upstream sees it.
    return _bad(f"Invalid value for '{at}': Expected `str` of length >= 1", param)


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
        raise _bad(
            f"'model' must be 1 to {MAX_MODEL_CHARS} printable characters (no control or format characters)",
            "model",
        )
    # They end a URL path (`?`, `#`) or act as a path separator on some servers (a backslash): never in a model id.
    if "?" in model or "#" in model or "\\" in model:
        raise _bad("'model' may not contain '?', '#' or a backslash", "model")
    if "/." in "/" + model and any(seg in (".", "..") for seg in model.split("/")):
        raise _bad("'model' may not contain '.' or '..' segments", "model")
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
        raise _bad(f"only one structured-output constraint may be set, got {', '.join(guided)}", guided[1])
    if guided and req.response_format is not None and req.response_format.get("schema") is not None:
        raise _bad(f"'response_format' with a schema conflicts with '{guided[0]}'", "response_format")
    choices = req.guided_choice
    if choices is not None:
        if not choices:
            raise _bad("'guided_choice' must not be empty", "guided_choice")
        # Whichever provider serves the request, the gateway may check the answer itself (a failover to a kind
        # that emulates it) or build the server's grammar from the choices: both held to one bound.
        if len(choices) > GUIDED_CHOICES or sum(map(len, choices)) > GUIDED_CHOICE_CHARS:
            raise _bad(
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
        raise _bad(f"'{name}' may hold sequences of at most {caps.pattern_chars} characters", name)
    return stop or None


def _check_choices(n: int, n_prompts: int) -> None:
    if n * n_prompts > MAX_CHOICES:
        raise _bad(f"at most {MAX_CHOICES} choices per request (prompts x n)", "n")


def _refuse_held(req: CompletionRequest, names: tuple[str, ...]) -> None:
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
        _refuse_held(req, ("continue_final_message", "add_generation_prompt"))

    limit: int | None = None
    for name in ("max_tokens", "max_new_tokens", "max_completion_tokens"):
        value = getattr(req, name)
        if value is None:
            continue
        if limit is not None and value != limit:
            raise _bad(f"'{name}' ({value}) disagrees with the token limit already given ({limit})", name)
        limit = value
    req.max_tokens, req.max_new_tokens, req.max_completion_tokens = limit, None, None

    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    if req.stop_sequences is not None:
        if stop is not None and stop != req.stop_sequences:
            raise _bad("'stop_sequences' disagrees with 'stop'", "stop_sequences")
        stop = req.stop_sequences
    req.stop = _bounded_stops(stop, "stop_sequences" if req.stop_sequences is not None else "stop", caps)
    req.stop_sequences = None

    lp = req.logprobs
    count: int | None
    if isinstance(lp, bool):
        if not lp and req.top_logprobs:
            raise _bad("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
        count = (req.top_logprobs or 0) if lp else None
    else:
        if lp is not None and req.top_logprobs is not None and req.top_logprobs != lp:
            raise _bad("'top_logprobs' disagrees with the integer 'logprobs'", "top_logprobs")
        count = lp
    if count is None and req.top_logprobs is not None:
        raise _bad("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
    if count is None and req.return_token_log_probs:
        count = 0
    req.logprobs, req.top_logprobs, req.return_token_log_probs = count, None, None

    n = req.n or 1
    if req.best_of is not None:
        if req.best_of < n:
            raise _bad("'best_of' must be greater than or equal to 'n'", "best_of")
        if req.stream:
            raise _bad("'best_of' cannot be used with 'stream'", "best_of")
    _check_choices(max(n, req.best_of or 0), n_prompts)

    if req.stream_options is not None and not req.stream:
        raise _bad("'stream_options' is only allowed when 'stream' is true", "stream_options")

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
            raise _bad("'inference_timeout' must be a number of seconds", "inference_timeout") from None
        if not seconds > 0:
            raise _bad("'inference_timeout' must be greater than 0", "inference_timeout")
        req.inference_timeout = seconds

    if req.inference_extra_headers:
        if len(req.inference_extra_headers) > MAX_EXTRA_HEADERS:
            raise _bad(
                f"'inference_extra_headers' may set at most {MAX_EXTRA_HEADERS} headers", "inference_extra_headers"
            )
        for header, value in req.inference_extra_headers.items():
            if _refused_header(header):
                raise _bad(f"'inference_extra_headers' may not set '{shown(header)}'", "inference_extra_headers")
            # Sent as written on the upstream's wire: a name must be an HTTP token and a value one line of
            # latin-1 text, or a client could smuggle a header or a second request.
            if not _HEADER_NAME.fullmatch(header) or not _HEADER_VALUE.fullmatch(value):
                raise _bad(
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
                raise _bad(f"'inference_extra_params' may not set '{key}'", "inference_extra_params")
        no_chat_template(req.inference_extra_params.get("chat_template_kwargs"), "inference_extra_params.")
        salt = req.inference_extra_params.get("cache_salt")
        if salt is not None:
            # Sent where the top-level field goes, so held to the same rule (an engine's prefix-cache partition).
            try:
                msgspec.convert(salt, CacheSalt)
            except msgspec.ValidationError:
                raise _bad(
                    "'inference_extra_params.cache_salt' must be 1 to 256 characters of A-Z a-z 0-9 . _ : / + = -, "
                    "like the top-level 'cache_salt'",
                    "inference_extra_params.cache_salt",
                ) from None
    if req.__class__ is not ChatRequest:  # normalize_chat counts a chat's, with its messages'
        req.unrendered = unrendered(req, len(req.images or ()), caps.image_tokens)
    return req


_CHAT_SHAPES: Final = CHAT_SHAPES
_chat_shaped: Final = operator.attrgetter(*(name for name, _ in CHAT_SHAPES))
_NO_SHAPES: Final = (None,) * len(CHAT_SHAPES)


def _prefill(req: ChatRequest) -> None:
    """`continue_final_message` and `add_generation_prompt` as one choice: the trailing assistant message is
    continued (set), or the answer follows the conversation (None). Only a route that can continue takes
    the first; the second's own value (true) is every route's default, and false is vLLM's field alone."""
    if req.continue_final_message:
        if req.add_generation_prompt:
            raise _bad(
                "'continue_final_message' and 'add_generation_prompt' cannot both be true", "continue_final_message"
            )
        last = req.messages[-1]
        if not isinstance(last, AssistantMessage) or last.tool_calls or last.content is None:
            raise _bad(
                "'continue_final_message' continues the last message, which must be an assistant message with "
                "content and no tool calls",
                "messages",
            )
        req.add_generation_prompt = None  # implied
    else:
        req.continue_final_message = None
        if req.add_generation_prompt:
            req.add_generation_prompt = None


def _bound_echo(req: ChatRequest, limit: int) -> None:
    """Each choice repeats the echoed message: a message of megabytes times `n` is refused before any call."""
    total = len(echoed(req)) * (req.n or 1)
    if total > limit:
        raise _bad(
            f"'echo' would make the gateway build {total} bytes from copies of the last message (one per choice); "
            f"at most {limit} are allowed",
            "echo",
        )


# Completion-only fields chat's request holds under names with a leading space (wire.chat.ChatRequest), so that
# their real names are unknown fields there: sent under the held names, they are unknown fields all the same.
_COMPLETION_ONLY: Final = (
    "best_of",
    "echo",
    "suffix",
    "max_new_tokens",
    "stop_sequences",
    "return_token_log_probs",
    "images",
    "context_length_exceeded_behavior",
)
_completion_only: Final = operator.attrgetter(*_COMPLETION_ONLY)
_NONE_HELD: Final = (None,) * len(_COMPLETION_ONLY)


# The answers of no turn: a turn opens with a set of its own, so nothing is ever added to this one.
_UNOPENED: Final[set[str]] = set()


def normalize_chat(req: ChatRequest, caps: CapsConfig = _DEFAULT_CAPS) -> ChatRequest:
    """`normalize` for a chat request: `logprobs` is a boolean there, `tools`, `tool_choice` and
    `response_format` must have OpenAI's shapes, and `prompt` becomes the rendered conversation."""
    if _completion_only(req) != _NONE_HELD:
        _refuse_held(req, _COMPLETION_ONLY)
    if req.logprobs is not None and not isinstance(req.logprobs, bool):
        raise _bad("'logprobs' must be a boolean on chat completions; 'top_logprobs' sets the count", "logprobs")
    if _chat_shaped(req) != _NO_SHAPES:  # one C call when none is set, as in most requests
        for name, shape in _CHAT_SHAPES:
            value = getattr(req, name)
            if value is not None:
                try:
                    msgspec.convert(value, shape)
                except msgspec.ValidationError as exc:
                    # Named from the body's root, as the decoder names any other field.
                    problem, at, path = str(exc).partition(" - at `$")
                    at = f"{problem} - at `$.{name}{path if at else '`'}"
                    raise decode_error(msgspec.ValidationError(at)) from None
    if req.prompt_logprobs is not None and req.stream:
        # No chat route streams them (vLLM's refuses): before the cache, whose buffered answer could carry them.
        raise _bad("'prompt_logprobs' are not available on a streamed chat completion", "prompt_logprobs")
    if req.tool_choice is not None and not req.tools:
        raise _bad("'tool_choice' is only allowed when 'tools' are given", "tool_choice")
    if req.parallel_tool_calls is not None and not req.tools:
        raise _bad("'parallel_tool_calls' is only allowed when 'tools' are given", "parallel_tool_calls")
    bound_conversation(req.messages, caps.chat_messages, caps.chat_content_parts, caps.json_depth)
    back = said = False
    images = 0
    calls: frozenset[str] = frozenset()  # the ids of the nearest assistant message before with tool calls
    unanswered = unreplied = repeated = None
    # The open turn: the index of the assistant message with tool calls until another assistant message follows
    # (-1: none), and the ids of its calls answered so far (made with the turn: none for a conversation without).
    turn = -1
    answered = _UNOPENED
    for i, m in enumerate(req.messages):
        if m.type is not None:
            m.type = None  # lm-eval's mark (wire.chat.Mark), for no upstream
        if m.__class__ is AssistantMessage:
            if turn >= 0:
                if unreplied is None and len(answered) < len(calls):
                    unreplied = turn
                turn = -1
            if m.content is None and not (m.tool_calls or m.refusal or m.reasoning_content or m.thinking_blocks):
                # An empty turn: OpenAI refuses it, and the kinds with their own bodies drop or refuse it.
                raise _bad(
                    f"'messages[{i}].content' is required on an assistant message without tool_calls",
                    "messages.content",
                )
            if m.tool_calls:
                said = True  # their ids go beside the rendered text
                for j, call in enumerate(m.tool_calls):
                    if not call.id:
                        raise _empty_id(f"messages[{i}].tool_calls[{j}].id", "messages.tool_calls.id")
                calls = frozenset(call.id for call in m.tool_calls)
                turn = i
                answered = set()
            if m.reasoning_content is not None or m.thinking_blocks is not None:
                back = True
            if m.refusal is not None:
                said = True
        elif m.__class__ is UserMessage and m.content.__class__ is list:
            images += image_parts(m.content)
        elif m.__class__ is ToolMessage:
            said = True  # its tool_call_id, as a call's id
            if not m.tool_call_id:
                raise _empty_id(f"messages[{i}].tool_call_id", "messages.tool_call_id")
            if m.tool_call_id not in calls:
                if unanswered is None:
                    unanswered = i
            elif turn >= 0:
                if m.tool_call_id not in answered:
                    answered.add(m.tool_call_id)
                elif repeated is None:
                    repeated = i
    # A conversation that ends with the calls themselves goes as it is: only a later message leaves them unanswered.
    if 0 <= turn < len(req.messages) - 1 and unreplied is None and len(answered) < len(calls):
        unreplied = turn
    req.thinking_back = back
    # Refused where the route's server refuses them (providers/tool_results.py).
    req.unanswered, req.unreplied, req.repeated = unanswered, unreplied, repeated
    if req.continue_final_message is not None or req.add_generation_prompt is not None:
        _prefill(req)
    if req.echo_last is False:
        req.echo_last = None  # the default: one cache entry for both
    req.prompt = render(req.messages)
    normalize(req, caps)
    # Always set (a client's own " unrendered" never stands), once its fields are checked and folded; the
    # common request (a conversation alone) without a call.
    beside = images or back or said or chat_beside(req) != NOTHING_BESIDE
    req.unrendered = unrendered(req, images, caps.image_tokens, back or said) if beside else None
    if req.echo_last:
        _bound_echo(req, caps.emulated_answer_bytes)
    return req
