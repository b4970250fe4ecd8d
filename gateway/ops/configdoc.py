"""Generate the key tables of docs/config.md from the typed config, so the document cannot drift.

    python -m gateway docs            # rewrite docs/config.md in place (`make docs`)
    python -m gateway docs --check    # exit 1 when it is stale (tests/unit/test_configdoc.py does the same)

Where a key's meaning comes from, and which part of docs/config.md is rewritten: docs/operations.md.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import msgspec
from msgspec import inspect as mi

from gateway import config as cfgmod
from providers import registry
from providers.tokenizer import NO_TOKENIZER

BEGIN = "<!-- BEGIN GENERATED"
END = "<!-- END GENERATED -->"
NOTE = " by `make docs` (python -m gateway docs) from gateway/config/schema.py; meanings: gateway/ops/configdoc.py -->"
DOC = Path("docs") / "config.md"


def provider_kinds() -> tuple[str, ...]:
    """Every provider kind, in the registry's order: the one place this generator learns them."""
    return tuple(registry.kinds())


def kinds_needing_base_url() -> tuple[str, ...]:
    """The kinds without a public default URL (a provider of such a kind must set `base_url`)."""
    return tuple(k for k in provider_kinds() if registry.REGISTRY[k].needs_base_url)


def kinds_needing_region() -> tuple[str, ...]:
    return tuple(k for k in provider_kinds() if registry.REGISTRY[k].needs_region)


def kinds_listing_by_default() -> tuple[str, ...]:
    """The kinds whose model listing is asked unless `discover: false` (self-hosted servers)."""
    return tuple(k for k in provider_kinds() if (listing := registry.REGISTRY[k].model_listing) and listing[1])


def kinds_with_tokenizer() -> tuple[str, ...]:
    return tuple(k for k in provider_kinds() if registry.REGISTRY[k].tokenizer is not NO_TOKENIZER)


# Curated meanings, by path (`<name>` for a map key, `[]` for a list item). Links are relative to docs/.
MEANINGS: dict[str, str] = {
    "server.host": "listen address (`serve --host` overrides)",
    "server.port": "listen port (`serve --port` overrides)",
    "server.workers": "worker processes (`serve --workers` overrides); more than one without Redis means per-process "
    "state",
    "server.pin_workers": "Linux: each worker process, with the threads it starts (the ledger's writer), on a core "
    "of its own, the first free one of those the process may use; a worker that finds none free runs unpinned. "
    "For hosts whose cores are all busy; not where other services' processes were given the same cores "
    "([performance.md](performance.md#the-ledger))",
    "server.shutdown_grace_ms": "on SIGTERM: stop accepting at once, let requests and streams in flight finish for up "
    "to this long (whole seconds, rounded up), then cut them; then batch lines in flight get as long again "
    "([batches.md](batches.md#nothing-lost-nothing-run-twice)), and it exits; keep Docker's `stop_grace_period` "
    "and Kubernetes' `terminationGracePeriodSeconds` (less the preStop pause) above it, twice it where batches "
    "run ([deploy.md](deploy.md))",
    "redis.url": "`redis://host:port/db` (`rediss://` TLS, `unix://`), `redis+cluster://h:p,h:p` (Redis Cluster) or "
    "`redis+sentinel://h:p,h:p/service` (Sentinel); options in the query string, refused at load when the gateway "
    "cannot honour them ([ratelimits.md](ratelimits.md#redis-deployments-one-node-cluster-sentinel)). Empty: state "
    "(cooldowns, limits) lives in process memory. When set, `/ready` PINGs it; every Redis call has a deadline of "
    "twice the URL's `socket_timeout` (0.25 s by default, so 0.5 s)",
    "redis.on_failure": "rate limits while Redis is unreachable: per-process limits, or 503 "
    "([ratelimits.md](ratelimits.md))",
    "redis.refresh_ms": "how old a replica's copy of the shared target health may be before it reads Redis again; its "
    "own changes are seen at once; 0 reads on every request. A request that finds the copy past three quarters "
    "of this age starts the read and does not wait for it",
    "logging.requests": "one JSON line per request on stderr ([observability.md](observability.md))",
    "logging.prompts": "include prompt and completion text in that line",
    "guided_retries": "re-asks after an emulated `guided_*` answer fails validation ([emulation.md](emulation.md))",
    "unsupported_params": "a field the provider cannot honour: 400 naming it, or drop it and list it in the "
    "`x-gateway-dropped-params` response header",
    "timeouts.connect_ms": "TCP connect to an upstream; set above `total_ms` is refused (unset, `total_ms` cuts it "
    "short)",
    "timeouts.first_byte_ms": "wait for the first byte, and for every later read of a stream; set above `total_ms` is "
    "refused",
    "timeouts.total_ms": "the whole upstream call; a request's `inference_timeout` (seconds) can only shorten it",
    "timeouts.stream_idle_ms": "a stream's time since its last event that carried anything for the client (text, a "
    "choice, usage, a finish), looked at when a keep-alive, comment or ignored event arrives (silence alone is "
    "`first_byte_ms`'s); beyond it the stream fails as the upstream's fault (`upstream_stream_idle`, 502 before the "
    "first event, an error event after it), retried, failed over or resumed like a broken stream; set above "
    "`total_ms` is refused",
    "retries.attempts": "upstream calls per request, across targets and fallbacks",
    "retries.initial_backoff_ms": "first backoff when retrying the same target without a Retry-After; set above "
    "`max_backoff_ms` is refused",
    "retries.max_backoff_ms": "backoff cap (full jitter below it)",
    "retries.budget_ms": "no retry starts if its wait would end past this time since the request arrived",
    "retries.same_target": "same-target retries of a transient failure (5xx, dropped connection, 429 that fits the "
    "budget) before moving on; alias > provider > global ([resilience.md](resilience.md))",
    "cooldown.base_ms": "first cooldown of a failing target without Retry-After; doubles per consecutive failure; set "
    "above `max_ms` is refused",
    "cooldown.max_ms": "cooldown cap; also the cooldown after an exhausted-quota 429 or refused credentials",
    "cooldown.min_requests": "distinct failed requests within `window_ms` before a 5xx or timeout cools a target",
    "cooldown.failure_ratio": "share of a target's requests in the window (and of each client key's) that must fail",
    "cooldown.window_ms": "sliding window over which 5xx and timeout failures are counted per target",
    "keys": "client keys; none means the gateway is open (said once at start-up)",
    "keys[].name": "shown in 403 messages and logs, unique; no `/` (a team's runtime key is shown as `team/name`), "
    "not beginning `team:` (a team's share of the queue)",
    "keys[].key": "the secret, normally `${VAR}`; each key's own (two keys with one secret are refused)",
    "keys[].models": "model strings this key may call, matched against what the client sends: `*` and `?` stop at `/`, "
    "`**` crosses it (`openai/*`, `fireworks/**`, `fast`); everything else is literal; one that can match no alias and "
    "no `<provider>/<model>` is refused at load ([security.md](security.md#key-globs--stops-at-)); a key of a team is "
    "also held to `teams.<name>.models` ([security.md](security.md#team-models))",
    "keys[].max_cost_per_day": "daily budget per UTC day: at or over it, 429 `budget_exceeded` until 00:00 UTC; `0` "
    "blocks the key; above the key's `max_cost_per_month` is refused ([operations.md](operations.md))",
    "prices": "model string or glob → `{prompt_per_1m, completion_per_1m}` (USD per million tokens, default 0) for "
    "usage cost and budgets; exact served target, then exact alias, then globs in order; one that can match no alias "
    "and no `<provider>/<model>` is refused at load ([operations.md](operations.md#prices))",
    "metrics.key": "when set (normally `${GATEWAY_METRICS_KEY}`), `GET /metrics` answers only `Authorization: Bearer "
    "<key>` (401 otherwise); an unset `${VAR}` keeps it closed; empty: open ([observability.md](observability.md))",
    "caps.request_body_bytes": "a client request body, and each line of a batch's input file; 413 beyond it, in "
    "the route's dialect ([batches.md](batches.md#a-line-is-one-request))",
    "caps.json_depth": "nesting inside free-form fields (`response_format`, `guided_json`, `inference_extra_params`, "
    "the openai SDK's `parsed` sent back on a message, ...); 400 beyond it",
    "caps.chat_messages": "messages one chat request (or `/tokenize` conversation) may send (each is walked, "
    "rendered, counted and translated); "
    "400 naming `messages` beyond it",
    "caps.chat_content_parts": "content parts (text, image, refusal) a chat request's messages may hold together; "
    "400 naming `messages.content` (the message in the text) beyond it",
    "caps.budget_max_tokens": "completion tokens a budgeted request without `max_tokens` reserves per choice (nothing "
    "else bounds its answer but the model's context); an answer past it is charged in full, a stream as it runs "
    "([ledger.md](ledger.md#budgets))",
    "caps.image_tokens": "prompt tokens token limits and budgets count for each image a request sends (a chat's image "
    "parts, a completion's `images`; the gateway sees no pixels); the default covers OpenAI's and Anthropic's largest "
    "images, raise it for vision models that take more ([ratelimits.md](ratelimits.md#what-a-request-counts))",
    "caps.pattern_chars": "a client pattern (`guided_regex`, a schema `pattern`) and a gateway-enforced stop sequence, "
    "in characters",
    "caps.stop_chars": "stop sequences the gateway enforces itself (beyond a provider's count, or kept where it "
    "strips them), in characters together; 400 naming `stop` beyond it",
    "caps.guided_work": "keyword evaluations (about 10 µs each) one request may spend checking its answers against "
    "a client's JSON Schema, every choice and retry together; beyond it a 502 `guided_output_invalid`, not retried",
    "caps.schema_paths": "subschemas a client's JSON Schema may apply to one value through `$ref`s and "
    "`anyOf`/`allOf`/`oneOf`/`not`/`if` branches; 400 naming the field beyond it",
    "caps.emulated_answer_bytes": "the text an emulated answer may build (echo × n × prompts, best_of, chat's echoed "
    "message × n); 400 naming the field beyond it",
    "caps.fake_max_tokens": "tokens the built-in `fake` provider generates per choice; 400 naming `max_tokens` beyond "
    "it",
    "caps.detokenize_tokens": "token ids one `/detokenize` request may send (the upstream decodes each one); 400 "
    "naming `tokens` beyond it; raise it for a model whose context is longer",
    "caps.prompt_token_ids": "token ids one completion request's `prompt` may hold, all its prompts together (the "
    "upstream reads each one); 400 naming `prompt` beyond it; raise it for a model whose context is longer",
    "caps.param_token_ids": "token ids `stop_token_ids` and `allowed_token_ids` may each hold, and entries "
    "`logit_bias` may have, on completions and chat; 400 naming the field beyond it",
    "caps.tokenize_chars": "characters of text one `/tokenize` request may send (its `prompt`, or its messages' text "
    "together); 400 naming `prompt` or `messages` beyond it",
    "caps.upstream_body_bytes": "a buffered upstream answer, counted after gzip/deflate decoding; 502 beyond it",
    "caps.upstream_event_bytes": "one upstream stream line or event; 502 beyond it",
    "caps.upstream_idle_stream_bytes": "bytes of an upstream stream since its last event that carried anything for "
    "the client (text, a choice, usage, a finish): blank lines, comments, keep-alives and events the gateway ignores, "
    "an event still arriving not counted; beyond it the stream fails as the upstream's fault (`upstream_stream_idle`, "
    "502 before the first event, an error event after it), retried, failed over or resumed like a broken stream",
    "caps.upstream_header_bytes": "an upstream answer's status line, headers, interim answers and trailers; 502 beyond "
    "it",
    "caps.upstream_interim_answers": "interim (`1xx`) answers an upstream may send before its answer's final head "
    "(`100 Continue`, `103 Early Hints`); 502 `upstream_answer_too_large` beyond it",
    "caps.upstream_message_chars": "upstream error text relayed to a client or a log, after configured secrets are "
    "scrubbed from it",
    "tokenizer.default_model": "the model the bare `/tokenize`, `/detokenize` and `/tokenizer_info` routes use when "
    "the body names none: an alias or `vendor/model` "
    "([clients.md](clients.md#tokenizer-routes-and-the-model-scoped-base-path))",
    "discovery.enabled": "ask upstreams which models they serve, for `GET /v1/models` "
    "([clients.md](clients.md#get-v1models-what-can-really-be-called))",
    "discovery.ttl_ms": "how often each provider is asked again (in the background, never on the request path)",
    "discovery.timeout_ms": "one listing call's deadline",
    "discovery.concurrency": "providers asked at the same time",
    "discovery.max_models": "ids kept per provider",
    "admin.key": "the admin key for `GET /admin/usage` and `GET /admin/status` (the status page at `GET /` asks for "
    "it), normally `${GATEWAY_ADMIN_KEY}`; empty or unset: those routes answer 404",
    "providers": "`<name>` is the vendor in `vendor/model_name[/deployment]`; no `/`",
    "providers.<name>.api_key": "the upstream credential, normally `${VAR}`. For `bedrock`: "
    "`${AWS_ACCESS_KEY_ID}:${AWS_SECRET_ACCESS_KEY}` for SigV4 signing, with `:${AWS_SESSION_TOKEN}` appended for "
    "temporary credentials (`:${AWS_SESSION_TOKEN:-}` when optional); or an Amazon Bedrock API key "
    "(`${AWS_BEARER_TOKEN_BEDROCK}`, sent as `Authorization: Bearer`)",
    "providers.<name>.api_version": "Azure `api-version`",
    "providers.<name>.region": "e.g. `us-east-1`: the endpoint `https://bedrock-runtime.<region>.amazonaws.com` "
    "(unless `base_url` is set) and the SigV4 scope; an unset `${VAR}` makes requests fail naming the missing region",
    "providers.<name>.deployments": "named deployments: `base_url`, `api_key`, `api_version`, `name` (the upstream's "
    "own model/deployment name when it differs)",
    "providers.<name>.models": "model names advertised in `GET /v1/models`; routing does not require a model to be "
    "listed",
    "providers.<name>.headers": "extra headers sent upstream (e.g. `x-selected-account-id` for SGP)",
    "providers.<name>.default_max_tokens": "for providers that require a token limit (Anthropic): sent when the "
    "request gives none",
    "providers.<name>.unsupported_params": "per-provider override",
    "providers.<name>.timeouts": "per-provider override",
    "providers.<name>.retries": "per-provider override (direct `vendor/model` requests)",
    "providers.<name>.max_connections": "keep-alive connection pool size for this provider",
    "providers.<name>.max_logprobs": "the most logprobs this provider returns (vLLM's `--max-logprobs`, 20 by "
    "default); a larger request is a 400 naming `logprobs`",
    "providers.<name>.max_n": "the most choices (`n`) one call to this provider makes; a larger `n` is fanned out, "
    "one call per choice. For llama-server (`llamacpp`) it turns on `n` in one call, the prompt evaluated once "
    "(set it to the server's `--parallel` or less; a server older than `n` support answers one choice, a 502 "
    "`upstream_ignored_n`): "
    "[emulation.md](emulation.md#n-on-llama-server)",
    "providers.<name>.discover": "ask this provider's model listing for `GET /v1/models`: on for "
    f"{', '.join(kinds_listing_by_default())}; off for hosted catalogs",
    "providers.<name>.tokenizer_url": "where the provider's tokenizer routes are "
    f"({', '.join(kinds_with_tokenizer())})",
    "providers.<name>.transport": "the upstream HTTP client: the fast built-in HTTP/1.1 client, or httpx; `auto` picks "
    "httpx when a key below or a proxy environment variable needs it "
    "([security.md](security.md#the-second-transport-httpx-and-the-differential-proof))",
    "providers.<name>.proxy": "`http://` or `https://` proxy for this provider; unset: `HTTPS_PROXY` / `HTTP_PROXY` / "
    "`ALL_PROXY` with `NO_PROXY` from the environment",
    "providers.<name>.ca_bundle": "PEM CA certificates trusted for this provider instead of the system store",
    "providers.<name>.http2": "offer HTTP/2 by ALPN over TLS (httpx)",
    "models": "aliases",
    "models[].name": "the alias clients send as `model`; unique, not empty; checked before `vendor/...`",
    "models[].strategy": "how targets are ordered per request",
    "models[].fallbacks": "aliases or `vendor/model` strings tried, in order, after the targets; an alias's own "
    "fallbacks are not followed, and an alias naming itself is refused ([resilience.md](resilience.md))",
    "models[].context_window_fallbacks": "where a context-window error goes",
    "models[].resume_streams": "continue a broken text stream on another target",
    "models[].hedge_after_ms": "send a second request if the first has not answered by then; above the alias's "
    "`total_ms` is refused",
    "prices.<model>.prompt_per_1m": "USD per million prompt tokens",
    "prices.<model>.completion_per_1m": "USD per million completion tokens",
    "keys[].limits": "rate limits of this key; the same block sits under `teams.<name>` (all of a team's keys "
    "together), `models[]`, `providers.<name>` and `providers.<name>.deployments.<d>` "
    "([ratelimits.md](ratelimits.md))",
    "keys[].limits.rps": "requests per second",
    "keys[].limits.rpm": "requests per minute",
    "keys[].limits.tpm": "tokens (prompt + completion) per minute",
    "keys[].limits.tpd": "tokens per UTC day",
    "keys[].limits.concurrent": "requests in flight at once",
    "providers.<name>.limits": "the upstream's own quota, enforced by the gateway so that replicas stop before the "
    "upstream refuses ([ratelimits.md](ratelimits.md))",
    "providers.<name>.deployments.<d>.base_url": "this deployment's root URL (e.g. an Azure resource in another "
    "region)",
    "providers.<name>.deployments.<d>.api_key": "this deployment's credential, normally `${VAR}`",
    "providers.<name>.deployments.<d>.api_version": "Azure `api-version` for this deployment",
    "providers.<name>.deployments.<d>.limits": "this deployment's own quota",
    "providers.<name>.client_cert": "mTLS: PEM client certificate chain (the key may be in the same file)",
    "providers.<name>.client_key": "mTLS: the client certificate's PEM key; needs `client_cert`",
    "models[].targets": "where the alias routes: at least one target",
    "models[].targets[].model": "`vendor/model_name[/deployment]` of a configured provider",
    "models[].targets[].weight": "share of requests under `strategy: weighted`",
    "models[].retries": "per-alias override of `retries`",
    "models[].timeouts": "per-alias override of `timeouts`",
    "models[].limits": "rate limits of the alias, over all of its targets",
}

# The default column where the type's own default ("unset") would say too little.
DEFAULTS: dict[str, str] = {
    "retries.same_target": "unset (1)",
    "timeouts.stream_idle_ms": "`first_byte_ms`",
    "providers.<name>.base_url": "the kind's public URL",
    "providers.<name>.api_version": "`2024-10-21` (azure)",
    "providers.<name>.default_max_tokens": "the kind's default",
    "providers.<name>.max_logprobs": "the kind's bound",
    "providers.<name>.max_n": "unbounded where the kind takes `n`; fanned out where it does not",
    "providers.<name>.discover": "the kind's default",
    "providers.<name>.tokenizer_url": "`base_url` without a trailing `/v1`",
    "providers.<name>.region": "required for " + ", ".join(f"`{k}`" for k in kinds_needing_region()),
    "providers.<name>.unsupported_params": "the global value",
    "providers.<name>.timeouts": "the global value",
    "providers.<name>.retries": "the global value",
    "models[].retries": "the global value",
    "models[].timeouts": "the global value",
}

# The type column where the type's own rendering would be too long.
TYPES: dict[str, str] = {"providers.<name>.kind": "a provider kind (below)"}

# Fields typed loosely in GatewayConfig because the loader converts them one by one (so an error names the
# entry): the struct each entry really is.
LOOSE: dict[str, type[msgspec.Struct]] = {"providers": cfgmod.ProviderConfig}
# How a map's key is written in a path.
MAP_KEYS: dict[str, str] = {"providers": "<name>", "deployments": "<d>", "prices": "<model>"}


def _generated_meanings() -> dict[str, str]:
    """Meanings whose facts come from the code, not from prose."""
    kinds = ", ".join(f"`{k}`" for k in provider_kinds())
    return {
        "providers.<name>.kind": f"the API the provider speaks, one of the {len(provider_kinds())} kinds: {kinds} "
        "(what each accepts: [providers.md](providers.md))",
        "providers.<name>.base_url": "the upstream's root URL; required for "
        + ", ".join(f"`{k}`" for k in kinds_needing_base_url())
        + " (each deployment may give its own instead); no `user:password@` (refused: the key goes in `api_key`),"
        + " no `?query` or `#fragment` (each route is appended to it)",
    }


class Row(typing.NamedTuple):
    path: str
    type: str
    default: str
    meaning: str


def _comments(cls: type) -> dict[str, str]:
    """The comment lines written right above each field of a config struct, joined: its meaning."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in source.splitlines()[1:]:
        if re.match(r"^    #", line):
            text = line.strip().lstrip("#").strip()
            pending = [] if text.startswith("--") else [*pending, text]  # `# -- group --` heads a group
            continue
        field = re.match(r"^    (\w+)\s*:", line)
        if field and pending:
            out[field.group(1)] = " ".join(pending)
        pending = []
    return out


def _bounds(t: mi.IntType | mi.FloatType) -> str:
    lo = (t.ge, "≥") if t.ge is not None else (t.gt, ">") if t.gt is not None else None
    hi = (t.le, "≤") if t.le is not None else (t.lt, "<") if t.lt is not None else None
    if lo and hi and lo[1] == "≥" and hi[1] == "≤":
        return f" {lo[0]}–{hi[0]}"
    return "".join(f" {sign} {value}" for value, sign in (b for b in (lo, hi) if b is not None))


def _type(t: mi.Type) -> str:
    if isinstance(t, mi.IntType):
        return "int" + _bounds(t)
    if isinstance(t, mi.FloatType):
        return "float" + _bounds(t)
    if isinstance(t, mi.BoolType):
        return "bool"
    if isinstance(t, mi.StrType):
        return f"string matching `{t.pattern}`" if t.pattern else "string"
    if isinstance(t, mi.LiteralType):
        return " | ".join(f"`{v}`" for v in t.values)
    if isinstance(t, mi.ListType):
        item = t.item_type
        what = "strings" if isinstance(item, mi.StrType) else "maps" if isinstance(item, mi.StructType) else "items"
        return f"list of {what}" + (f", ≥ {t.min_length}" if t.min_length else "")
    if isinstance(t, mi.DictType):
        return "map of strings" if isinstance(t.value_type, mi.StrType) else "map"
    if isinstance(t, mi.StructType):
        return "map"
    if isinstance(t, mi.AnyType):
        return "any"
    raise TypeError(f"no rendering for {t!r}: teach gateway/ops/configdoc.py")


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f" ({n // scale} {unit})"
    return ""


def _default(field: mi.Field, path: str) -> str:
    if path in DEFAULTS:
        return DEFAULTS[path]
    if field.required:
        return "required"
    value = field.default_factory() if field.default_factory is not msgspec.NODEFAULT else field.default
    if isinstance(value, msgspec.Struct):
        return ""  # its keys follow
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int):
        return f"`{value}`" + (_size(value) if path.endswith("_bytes") else "")
    if isinstance(value, str) and value:
        return f"`{value}`"
    return f"`{json.dumps(value, ensure_ascii=False, separators=(', ', ': '))}`"


def _walk(struct: mi.StructType, prefix: str, seen: dict[type, str]) -> Iterator[tuple[str, str, str, str]]:
    """(path, type, default, comment) of every key under `struct`, depth first, in declaration order."""
    comments = _comments(struct.cls)
    for field in struct.fields:
        path = prefix + field.name
        t = field.type
        if isinstance(t, mi.UnionType):  # `X | None`: optional, documented as X with its default
            kept = [u for u in t.types if not isinstance(u, mi.NoneType)]
            t = kept[0] if len(kept) == 1 else t
        if path in LOOSE:
            t = mi.DictType(key_type=mi.StrType(), value_type=mi.type_info(LOOSE[path]))
        comment = comments.get(field.name, "")
        default = _default(field, path)
        inner, sub = t, ""
        if isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StructType):
            inner, sub = t.item_type, "[]"
        elif isinstance(t, mi.DictType) and isinstance(t.value_type, mi.StructType):
            inner, sub = t.value_type, "." + MAP_KEYS.get(field.name, "<key>")
        if not isinstance(inner, mi.StructType):
            yield path, _type(t), default, comment
            continue
        if inner.cls in seen:  # the same block again (limits, timeouts, retries): point at the first
            yield path, f"as `{seen[inner.cls]}`", default, comment or f"the keys of `{seen[inner.cls]}`"
            continue
        seen[inner.cls] = path + sub
        if sub or default != "":  # a collection, or an optional block; a plain block is its keys
            yield path, _type(t), default, comment or inner.cls.__dict__.get("__doc__") or ""
        yield from _walk(inner, path + sub + ".", seen)


def rows() -> list[Row]:
    generated = _generated_meanings()
    out: list[Row] = []
    for path, typ, default, comment in _walk(mi.type_info(cfgmod.GatewayConfig), "", {}):  # type: ignore[arg-type]
        meaning = MEANINGS.get(path) or generated.get(path) or comment
        out.append(Row(path, TYPES.get(path, typ), default, meaning))
    return out


def undocumented() -> list[str]:
    """Keys without a meaning, and MEANINGS or DEFAULTS entries that name no key: both must be empty."""
    table = rows()
    paths = {r.path for r in table}
    return [f"{r.path}: no meaning" for r in table if not r.meaning] + [
        f"{p}: names no config key" for p in sorted((set(MEANINGS) | set(DEFAULTS) | set(TYPES)) - paths)
    ]


def _cell(text: str) -> str:
    return re.sub(r"(?<!\\)\|", r"\\|", text)


def section() -> str:
    """The generated part of docs/config.md, markers included."""
    lines = [BEGIN + NOTE, "", "## Keys", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    for r in rows():
        lines.append(f"| `{r.path}` | {_cell(r.type)} | {_cell(r.default)} | {_cell(r.meaning)} |")
    kinds = provider_kinds()
    lines += [
        "",
        "## Provider kinds",
        "",
        f"`providers.<name>.kind` is one of these {len(kinds)}: " + ", ".join(f"`{k}`" for k in kinds) + ". "
        "A `base_url` is required for " + ", ".join(f"`{k}`" for k in kinds_needing_base_url()) + "; the others "
        "default to their public API. What each accepts and how it authenticates: [providers.md](providers.md).",
        "",
        END,
    ]
    return "\n".join(lines)


def render(current: str) -> str:
    """`current` with its generated section replaced (appended when it has none)."""
    # BEGIN alone (the rest of that line is NOTE), so a doc with any note, or none, is found.
    start, end = current.find(BEGIN), current.find(END)
    if start < 0 or end < start:
        return current.rstrip("\n") + "\n\n" + section() + "\n"
    return current[:start] + section() + current[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway docs", description="regenerate docs/config.md")
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale instead of writing it")
    parser.add_argument("--path", type=Path, default=DOC)
    args = parser.parse_args(argv)
    missing = undocumented()
    if missing:
        print("config keys without a meaning (add a comment above the field or a MEANINGS entry):", file=sys.stderr)
        print("\n".join(f"  {m}" for m in missing), file=sys.stderr)
        return 1
    current = args.path.read_text(encoding="utf-8")
    wanted = render(current)
    if args.check:
        if wanted != current:
            print(f"{args.path} is stale: run `make docs`", file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        args.path.write_text(wanted, encoding="utf-8")
        print(f"{args.path}: regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
