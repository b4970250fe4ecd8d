"""The adapter contract: pure translation between the gateway's Completion shapes and a vendor's API.

An adapter never does I/O. It builds an `UpstreamRequest` (a plain value), parses a response body,
parses one stream event, and maps an error response; `gateway.upstream.client` owns the sockets. Scalar
request fields are translated through a declarative `Table` of `Param`s: a field with no entry is not
supported by the provider and is refused (400 naming it) or dropped, never silently forwarded.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, ClassVar, Final, Literal, Protocol, Self
from urllib.parse import quote

import msgspec

from providers.call_context import CallContext as CallContext
from providers.engine import EngineGauges
from providers.guarded import ExtraMerge, guarded_write, merge_extra
from providers.quota import QuotaReader, counter_names
from providers.tokenizer import NO_TOKENIZER, TokenizerAPI
from wire.errors import GatewayError, InvalidRequestError, UnsupportedParamError
from wire.schema import INT64_MAX, NATIVE_FIELDS, Completion, CompletionRequest
from wire.upstream import UpstreamRequest as UpstreamRequest


class Endpoint(msgspec.Struct, frozen=True):
    """Where and as whom one routed model is called; built once per (provider, model, deployment)."""

    provider: str
    model: str
    base_url: str
    api_key: str | None = None
    deployment: str | None = None
    api_version: str | None = None
    headers: Mapping[str, str] = msgspec.field(default_factory=dict)
    # The provider's configured `default_max_tokens` (Anthropic requires a limit on every request).
    default_max_tokens: int | None = None
    # The provider's configured `region` (AWS Bedrock: its endpoint host and SigV4 scope).
    region: str | None = None


def _set_path(body: dict[str, Any], path: str, value: Any) -> None:
    node = body
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


class Param(msgspec.Struct, frozen=True):
    """How one canonical request field reaches the vendor.

    `to` is a dotted path in the vendor body (`options.num_predict`); `convert` reshapes the value;
    `apply` is the escape hatch for a field whose target depends on its value (it edits the body).
    `emulated` means the provider lacks the feature and the gateway provides it (`gateway.emulation.planning`):
    nothing is written to the vendor body.
    """

    to: str | None = None
    convert: Callable[[Any], Any] | None = None
    apply: Callable[[dict[str, Any], Any], None] | None = None
    emulated: bool = False

    def write(self, body: dict[str, Any], name: str, value: Any) -> None:
        if self.emulated:
            return
        if self.apply is not None:
            self.apply(body, value)
            return
        path, value = self.to or name, self.convert(value) if self.convert else value
        if "." in path:
            _set_path(body, path, value)
        else:
            body[path] = value  # a top-level field, as nearly all are: no split, no walk


Table = Mapping[str, Param]

# The gateway provides the field for this provider (fan-out for n, prepending for echo, ...).
EMULATED = Param(emulated=True)

# What a chat-style API without completion extras gets from the gateway: `table(..., **EMULATED_EXTRAS)`.
EMULATED_EXTRAS: Mapping[str, Param] = {
    name: EMULATED
    for name in (
        "n",
        "best_of",
        "echo",
        "include_stop_str_in_output",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    )
}

# Canonical fields an adapter may translate; the rest are handled by the gateway itself (model, prompt,
# stream*, inference_*, `unrendered`: limits' count) or folded away by normalize() (the alias names).
PARAM_FIELDS: tuple[str, ...] = tuple(
    f
    for f in CompletionRequest.__struct_fields__
    if f
    not in {
        "model",
        "prompt",
        "stream",
        "stream_options",
        "inference_timeout",
        "inference_extra_params",
        "inference_extra_headers",
        "unrendered",
        "max_new_tokens",
        "max_completion_tokens",
        "stop_sequences",
        "top_logprobs",
        "return_token_log_probs",
    }
)


def table(base: Table | None = None, *, drop: tuple[str, ...] = (), **params: Param) -> dict[str, Param]:
    """An OpenAI-compatible vendor is the base table minus what it lacks plus what it adds."""
    out = {k: v for k, v in (base or {}).items() if k not in drop}
    out.update(params)
    unknown = set(out) - set(PARAM_FIELDS)
    if unknown:
        raise ValueError(f"table names fields the request does not have: {sorted(unknown)}")
    return out


# Every field a table can map, in body order (the self-hosted servers' own last), by its place in the request
# struct, per struct type (chat's orders them otherwise): one `astuple` reads them all, not a `getattr` each.
_ORDER: tuple[str, ...] = (*(f for f in PARAM_FIELDS if f not in NATIVE_FIELDS), *NATIVE_FIELDS)
_PLACES: dict[type, tuple[tuple[int, str], ...]] = {}
_astuple = msgspec.structs.astuple


def _places(kind: type[CompletionRequest]) -> tuple[tuple[int, str], ...]:
    where = {f: i for i, f in enumerate(kind.__struct_fields__)}
    return _PLACES.setdefault(kind, tuple((where[f], f) for f in _ORDER))


def map_params(
    req: CompletionRequest, params: Table, provider: str, drop_unsupported: bool
) -> tuple[dict[str, Any], list[str]]:
    """Translate every set canonical field; return the vendor body fragment and what was dropped."""
    body: dict[str, Any] = {}
    dropped: list[str] = []
    values = _astuple(req)
    for i, name in _PLACES.get(type(req)) or _places(type(req)):
        if (value := values[i]) is None:
            continue
        if (rule := params.get(name)) is not None:
            rule.write(body, name, value)
        elif drop_unsupported:
            dropped.append(name)
        else:
            raise UnsupportedParamError(name, provider)
    return body, dropped


PromptForm = Literal["text", "texts", "tokens", "token_lists"]
ALL_PROMPT_FORMS: frozenset[PromptForm] = frozenset({"text", "texts", "tokens", "token_lists"})


def bearer(endpoint: Endpoint) -> dict[str, str]:
    """`Authorization: Bearer <key>`, or nothing for a keyless endpoint."""
    return {"authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}


def request_headers(
    req: CompletionRequest,
    endpoint: Endpoint,
    *,
    accept: str | None = "application/json",
    extra: Mapping[str, str] | None = None,
    auth: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """An upstream JSON request's headers: the client's `inference_extra_headers`, then ours (`accept`,
    `extra`), then the ones configured for the provider, then the credential, each layer replacing the one
    before.

    The client's layer is the lowest: it adds headers (a trace id, `openai-organization` where the operator
    pinned none) but never replaces one the gateway or the operator sets, such as SGP's
    `x-selected-account-id` (another account, with the gateway's key). Names are case-insensitive, so every
    layer is folded to lower case, and the client's `_` to `-` (an upstream may read both spellings as one
    header), before it is merged. gateway/path/request.py already refused the client's credential, framing
    and hop-by-hop headers.
    """
    # Plain loops rather than `update` from generators: this runs on every upstream request, and a
    # generator per layer cost more than the folding itself.
    headers: dict[str, str] = {}
    if req.inference_extra_headers:
        for k, v in req.inference_extra_headers.items():
            headers[k.lower().replace("_", "-")] = v
    headers["content-type"] = "application/json"
    if accept is not None:
        headers["accept"] = accept
    for layer in (extra, endpoint.headers, auth):
        if layer:
            for k, v in layer.items():
                headers[k.lower()] = v
    return headers


def stop_list(value: str | list[str]) -> list[str]:
    """`stop` as the list the chat-style APIs want (the request also allows one bare string)."""
    return [value] if isinstance(value, str) else value


def out_of_range(provider: str, field: str, value: float, low: float, high: float) -> InvalidRequestError:
    """The 400 for a value the gateway accepts but this provider's narrower documented range does not:
    refused rather than clamped, since a clamped value would silently change the sampling asked for."""
    return InvalidRequestError(
        f"Provider '{provider}' accepts '{field}' from {low:g} to {high:g}, got {value:g}",
        param=field,
        code="invalid_value",
    )


def path_segment(value: str, provider: str, *, slash: bool = False, safe: str = "") -> str:
    """`value` (client text: the model) percent-encoded as ONE URL path segment, or a 400 naming `model`.

    `.` and `..` are refused outright: servers and clients normalize them away, which would move the
    request to another path on the provider's host, with the gateway's key. A `/` is refused unless the
    provider's API documents ids containing it (`slash=True`: it is then encoded as `%2F`, still one
    segment). `safe` lists further characters the provider expects unencoded (Bedrock signs its path).
    """
    if value in ("", ".", ".."):
        raise InvalidRequestError(
            f"'model' cannot name a model of provider '{provider}': {value!r} is not a model id",
            param="model",
            code="invalid_value",
        )
    if not slash and "/" in value:
        raise InvalidRequestError(
            f"'model' cannot name a model of provider '{provider}': its model ids contain no '/'",
            param="model",
            code="invalid_value",
        )
    return quote(value, safe=safe.replace("/", ""))


def prompt_form(prompt: str | list[Any]) -> PromptForm:
    if isinstance(prompt, str):
        return "text"
    first = prompt[0]
    if isinstance(first, str):
        return "texts"
    if isinstance(first, int):
        return "tokens"
    return "token_lists"


# `max_n` of a provider whose config sets none.
UNBOUNDED_N: Final = INT64_MAX


class Capabilities:
    """What a provider kind can take, declared as class attributes, and the checks that follow."""

    kind: ClassVar[str]
    in_process: ClassVar[bool] = False  # a `LocalAdapter`: tested per request, where an ABC isinstance costs more
    chat_route: ClassVar[bool] = False  # an `OpenAIChat`, likewise (`registry.register` holds both to the class)
    # Its `gen_ai.provider.name` in OpenTelemetry's GenAI semantic conventions (trace spans); None: the kind.
    genai_provider: ClassVar[str | None] = None
    # Not a ClassVar: `configure` gives a provider's instance its own where its config changes it (`max_n`).
    params: Table
    # The kind's chat parameters (providers/openai_chat.py `chat_table`); None: it does not serve chat yet.
    chat_params: ClassVar[Table | None] = None
    # Most stop sequences it takes: it is sent the first ones, the gateway enforces the rest (emulation); None: any.
    max_stop: ClassVar[int | None] = None
    # The provider leaves the matched stop sequence in its text (TGI): the gateway cuts it off unless asked to keep it.
    stop_in_output: ClassVar[bool] = False
    # Largest logprobs count the provider returns; a larger one is refused naming the bound. Not a ClassVar:
    # a self-hosted server's own flag (vLLM's --max-logprobs) is configured per provider (`configure`).
    max_logprobs: int = 5
    # Most choices one call makes (`providers.<name>.max_n`, per provider like `max_logprobs`): a larger `n` is
    # fanned out, one call per choice. Unbounded unless configured.
    max_n: int = UNBOUNDED_N
    # The body field of a kind whose server takes `n` only in newer builds (an older one ignores it and makes
    # one choice), used in place of the table's emulation once the operator sets `max_n`; None: the table says.
    opt_in_n: ClassVar[str | None] = None
    prompt_forms: ClassVar[frozenset[PromptForm]] = ALL_PROMPT_FORMS
    default_base_url: ClassVar[str | None] = None
    # Whether a key is required to call it (local servers such as vLLM often have none).
    needs_api_key: ClassVar[bool] = True
    # How the key travels, for docs/providers.md.
    auth: ClassVar[str] = "`Authorization: Bearer`"
    # What the provider generates when the request sets no limit (OpenAI's and vLLM's default is 16);
    # rate limiting reserves this many tokens per choice.
    default_max_tokens: ClassVar[int] = 16
    # Which of vLLM's tokenizer routes the provider's server has, and how to call them (providers/tokenizer.py).
    tokenizer: ClassVar[TokenizerAPI] = NO_TOKENIZER

    # What the rest of the gateway asks by kind. gateway/ never names a kind: it reads these.
    # The config must give a `base_url` (self-hosted servers have no public default) ...
    needs_base_url: ClassVar[bool] = False
    # ... or a `region` (Bedrock: it names the endpoint host and the signing scope).
    needs_region: ClassVar[bool] = False
    # Headers that carry the provider's credential: a client may never set them (gateway/path/request.py refuses
    # the union over every registered kind, whichever provider the request goes to).
    credential_headers: ClassVar[frozenset[str]] = frozenset({"authorization"})
    # Prompts are counted with OpenAI's BPE tables (the optional `bpe-openai` package) to reserve rate-limit
    # tokens; other kinds are estimated from the byte length (gateway/limits/tokens.py).
    openai_bpe: ClassVar[bool] = False
    # The rate-limit headers of the provider's successful answers (providers/quota.py): an exhausted counter
    # cools the target until its reset.
    quota_headers: ClassVar[tuple[QuotaReader, ...]] = ()
    # The GET that lists the server's models (path after the base URL) and whether it is asked by default
    # (self-hosted servers list what they serve; hosted catalogs also list models a completion refuses).
    model_listing: ClassVar[tuple[str, bool] | None] = None
    # A configured deployment's `name` replaces the model in the request (false for Azure, whose model
    # already is the deployment id in the URL).
    deployment_renames_model: ClassVar[bool] = True
    # How the client's `inference_extra_params` merge into the upstream body (`merge_extra`).
    extra_params: ClassVar[ExtraMerge] = "top"
    # Every upstream body path (dotted) that carries the prompt, the token limit or a choice count: what
    # admission reserved tokens for and emulation planned calls from. `inference_extra_params` may not
    # write any of them, nor replace an object that holds one (400 naming `inference_extra_params.<path>`).
    # providers/registry.py refuses a kind whose table writes `max_tokens`, `n` or `best_of` elsewhere.
    guarded_paths: ClassVar[frozenset[str]] = frozenset()
    # A self-hosted engine a provider may run as several replicas (`replicas:`, gateway/fleet), and the
    # Prometheus gauges of its own load (providers/engine.py), read when `routing.engine_metrics` is on.
    serves_replicas: ClassVar[bool] = False
    engine_gauges: ClassVar[EngineGauges | None] = None

    def add_extra(
        self,
        body: dict[str, Any],
        req: CompletionRequest,
        guarded: frozenset[str] | None = None,
        how: ExtraMerge | None = None,
    ) -> None:
        """The client's `inference_extra_params`, merged into the upstream body as this kind declares (or as
        `guarded` and `how` say, for a route whose body differs: chat)."""
        extra = req.inference_extra_params
        if extra:
            guarded = self.guarded_paths if guarded is None else guarded
            how = self.extra_params if how is None else how
            path = guarded_write(extra, guarded, how)
            if path is not None:
                raise InvalidRequestError(
                    f"'inference_extra_params' may not set '{path}' for provider kind '{self.kind}': it carries "
                    "the prompt, the token limit or the choice count, which rate limits reserve and the gateway "
                    "bounds; use the request's own fields (prompt, max_tokens, n, best_of)",
                    param=f"inference_extra_params.{path}",
                    code="invalid_value",
                )
            merge_extra(body, extra, how)

    def exhausted_for(self, headers: Mapping[str, str], now: float | None = None) -> float | None:
        """Seconds until the exhausted quota counter of a successful answer resets; None when none is."""
        names = counter_names(self.quota_headers)
        if names is not None and headers.keys().isdisjoint(names):
            return None  # no counter at all (nearly every self-hosted server's answers)
        # A loop, not a comprehension: on every answer, and a comprehension is a call of its own.
        longest: float | None = None
        for read in self.quota_headers:
            w = read(headers, now)
            if w is not None and (longest is None or w > longest):
                longest = w
        return longest

    def configure(self, max_logprobs: int | None = None, max_n: int | None = None) -> Self:
        """This provider's instance with the bounds its config sets (`providers.<name>.max_logprobs`, `max_n`).
        A kind with an `opt_in_n` field takes `n` natively on completions once `max_n` is set."""
        if max_logprobs is not None:
            self.max_logprobs = max_logprobs
        if max_n is not None:
            self.max_n = max_n
            field = self.opt_in_n
            if field is not None:
                native = Param(field)
                self.params = {**self.params, "n": native}
        return self

    def check(self, req: CompletionRequest, provider: str) -> None:
        """Refuse what the provider cannot honour, before any I/O."""
        if prompt_form(req.prompt) not in self.prompt_forms:
            raise UnsupportedParamError(
                "prompt", provider, f"Provider '{provider}' accepts only a single string prompt"
            )
        # Only where the table maps logprobs: elsewhere map_params refuses (or drops) the field by name.
        if req.logprobs is not None and req.logprobs > self.max_logprobs and "logprobs" in self.params:
            raise UnsupportedParamError(
                "logprobs",
                provider,
                f"Provider '{provider}' returns at most {self.max_logprobs} logprobs, got {req.logprobs}",
            )
        # vLLM holds prompt logprobs to the same --max-logprobs.
        count = req.prompt_logprobs
        if count is not None and count > self.max_logprobs and "prompt_logprobs" in self.params:
            raise UnsupportedParamError(
                "prompt_logprobs",
                provider,
                f"Provider '{provider}' returns at most {self.max_logprobs} prompt_logprobs, got {count}",
            )


class Adapter(Capabilities, abc.ABC):
    """An HTTP provider kind. Subclasses set the class attributes and implement the pure functions."""

    # How the upstream frames a stream: `sse`, `ndjson` or AWS's binary `eventstream` (gateway.upstream.framing).
    framing: ClassVar[Literal["sse", "ndjson", "eventstream"]] = "sse"

    def auth_headers(self, endpoint: Endpoint) -> dict[str, str]:
        """The credential as this provider's requests (and its model listing) carry it; a signing provider
        (Bedrock's SigV4) adds its own in `build_request`."""
        return bearer(endpoint)

    @abc.abstractmethod
    def build_request(self, req: CompletionRequest, endpoint: Endpoint, body: dict[str, Any]) -> UpstreamRequest:
        """`body` is the already-mapped parameter fragment; add model, prompt, stream framing, auth."""

    @abc.abstractmethod
    def parse_response(self, body: bytes, ctx: CallContext) -> Completion: ...

    @abc.abstractmethod
    def parse_event(self, event: str | None, data: bytes, ctx: CallContext) -> Completion | None:
        """One upstream stream event; None to skip it (keep-alives, the end marker, bookkeeping)."""

    @abc.abstractmethod
    def map_error(self, status: int, headers: Mapping[str, str], body: bytes, provider: str) -> GatewayError: ...


class LocalCaps(Protocol):
    """The work bounds an in-process provider is held to (the config's `caps:` section has them)."""

    @property
    def fake_max_tokens(self) -> int: ...

    @property
    def emulated_answer_bytes(self) -> int: ...


class LocalAdapter(Capabilities, abc.ABC):
    """A provider served inside the gateway process (the built-in `fake`)."""

    max_logprobs = 20
    in_process: ClassVar[bool] = True
    needs_api_key: ClassVar[bool] = False
    credential_headers: ClassVar[frozenset[str]] = frozenset()

    def admit(self, req: CompletionRequest, endpoint: Endpoint, caps: LocalCaps) -> None:
        """Refuse (400 naming the field) what would work beyond `caps`: this work runs on the gateway's loop."""

    @abc.abstractmethod
    async def complete(self, req: CompletionRequest, endpoint: Endpoint, ctx: CallContext) -> Completion: ...

    @abc.abstractmethod
    def stream(
        self, req: CompletionRequest, endpoint: Endpoint, ctx: CallContext
    ) -> AsyncGenerator[Completion, None]: ...
