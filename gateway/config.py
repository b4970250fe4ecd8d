"""The ops' YAML config, typed with msgspec and checked once at start-up.

A bad config raises `ConfigError`, whose text is one line naming the file, the YAML path and the
problem; the CLI prints it and exits 1, never a traceback. Secrets are written as `${VAR}` references
and resolved here; a reference to an unset variable does not fail the load (unless `strict`): the
provider or key using it is marked unavailable and requests to it fail fast naming the variable.
"""

from __future__ import annotations

import os
import re
import ssl
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
import yaml
from msgspec import Meta

from gateway.fleet.settings import ReplicaConfig, RoutingConfig, fleet_problem, replica_url
from gateway.state import url_problem
from providers.registry import REGISTRY, kinds
from wire.schema import MAX_LOGPROBS

ParamPolicy = Literal["error", "drop"]


class Strict(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    pass


class ServerConfig(Strict, frozen=True):
    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 8080
    workers: Annotated[int, Meta(ge=1, le=64)] = 1
    # On SIGTERM: stop accepting, let open requests and streams finish for up to this long, then cancel them.
    shutdown_grace_ms: Annotated[int, Meta(gt=0)] = 30_000


class RedisConfig(Strict, frozen=True):
    # Empty: state lives in process memory, which is only correct for a single process. One node
    # (redis://, rediss://, unix://), a Cluster (redis+cluster://h:p,h:p) or Sentinel
    # (redis+sentinel://h:p,h:p/service); options the gateway cannot honour are refused at load.
    url: str = ""
    # Rate limits while Redis is unreachable: keep serving on per-process limits, or refuse (503).
    on_failure: Literal["fail_open", "fail_closed"] = "fail_open"
    # How old a replica's copy of the shared target health (cooldowns, in-flight counts, latencies) may be
    # before it reads Redis again; its own changes are seen at once. 0: read on every request.
    refresh_ms: Annotated[int, Meta(ge=0, le=10_000)] = 250


class LimitsConfig(Strict, frozen=True):
    rps: Annotated[int, Meta(ge=1)] | None = None
    rpm: Annotated[int, Meta(ge=1)] | None = None
    tpm: Annotated[int, Meta(ge=1)] | None = None
    tpd: Annotated[int, Meta(ge=1)] | None = None
    concurrent: Annotated[int, Meta(ge=1)] | None = None
    # Wait up to this long for room instead of answering 429 at once.
    max_queue_ms: Annotated[int, Meta(ge=0)] = 0


class TimeoutsConfig(Strict, frozen=True):
    connect_ms: Annotated[int, Meta(gt=0)] = 5_000
    first_byte_ms: Annotated[int, Meta(gt=0)] = 120_000
    total_ms: Annotated[int, Meta(gt=0)] = 600_000


class LoggingConfig(Strict, frozen=True):
    # One JSON line per request, to stderr (gateway/accesslog.py).
    requests: bool = True
    # Include the prompt and the completion text in that line (off: they may hold personal data).
    prompts: bool = False


class RetriesConfig(Strict, frozen=True):
    # Upstream calls per request, across all of its targets and fallbacks (1 = no retry).
    attempts: Annotated[int, Meta(ge=1, le=20)] = 3
    initial_backoff_ms: Annotated[int, Meta(ge=0)] = 250
    max_backoff_ms: Annotated[int, Meta(ge=0)] = 8_000
    # No retry starts once its wait would carry the request past this much time since it arrived.
    budget_ms: Annotated[int, Meta(gt=0)] = 30_000
    # Retries of the SAME target (after its Retry-After, else backoff) before the request moves on, for a
    # transient failure: a 5xx, a dropped connection, a 429 whose wait fits the budget. So the answer comes
    # from the model asked for when it can. Timeouts, unreachable targets, exhausted quotas, a 404 and
    # context-window errors always move on at once. 0: every failure moves on at once (docs/resilience.md).
    # Unset: an alias's targets each take their provider's value, else the global one, else 1.
    same_target: Annotated[int, Meta(ge=0, le=10)] | None = None


def same_target_of(*blocks: RetriesConfig | None) -> int:
    """The first `same_target` set among these `retries` blocks (most specific first); 1 when none is."""
    return next((b.same_target for b in blocks if b is not None and b.same_target is not None), 1)


class CooldownConfig(Strict, frozen=True):
    base_ms: Annotated[int, Meta(gt=0)] = 1_000
    # Also the longest a target stays off after an outage ends (its probe follows the cooldown at once).
    max_ms: Annotated[int, Meta(gt=0)] = 20_000
    # A 5xx or a timeout may be the request's own doing (an input the upstream cannot take): it cools the
    # target only once this many distinct requests failed on it within `window_ms`, at least `failure_ratio`
    # of those it answered, and of every client key's own requests to it.
    min_requests: Annotated[int, Meta(ge=1)] = 3
    failure_ratio: Annotated[float, Meta(gt=0, le=1)] = 0.5
    window_ms: Annotated[int, Meta(gt=0)] = 10_000


Strategy = Literal["weighted", "ordered", "least-busy", "latency"]


class KeyConfig(Strict, frozen=True):
    name: str
    key: str
    # Glob patterns over the model string the client sends (`openai/*`, `fast`); `*` stops at `/`, `**`
    # crosses it (gateway/globs.py), so the default allows every model.
    models: list[str] = msgspec.field(default_factory=lambda: ["**"])
    limits: LimitsConfig | None = None
    # USD per UTC day (gateway/usage.py): at or over it, requests answer 429 `budget_exceeded`. 0 blocks the key.
    max_cost_per_day: Annotated[float, Meta(ge=0)] | None = None


class PriceConfig(Strict, frozen=True):
    """USD per million tokens, for usage accounting and budgets."""

    prompt_per_1m: Annotated[float, Meta(ge=0)] = 0.0
    completion_per_1m: Annotated[float, Meta(ge=0)] = 0.0


class AdminConfig(Strict, frozen=True):
    # The admin key for /admin/* (normally `${GATEWAY_ADMIN_KEY}`); empty or unset: the admin routes answer 404.
    key: str = ""


class MetricsConfig(Strict, frozen=True):
    # When set (normally `${GATEWAY_METRICS_KEY}`), GET /metrics answers only `Authorization: Bearer <key>`.
    key: str = ""


class TracingConfig(Strict, frozen=True):
    # OpenTelemetry traces over OTLP/HTTP (the `otel` extra); the OTEL_* variables configure the exporter, and
    # OTEL_TRACES_EXPORTER=otlp turns tracing on without this key (docs/observability.md).
    enabled: bool = False
    # What a client's `traceparent` does. `join`: the request's span is its child, so the client's trace id
    # and sampled flag go upstream (flag 00: the gateway records no span). `link`: the request starts a new
    # trace, sampled by the gateway's own sampler, whose span links to the client's; upstream gets only the
    # gateway's trace (docs/observability.md).
    client_context: Literal["join", "link"] = "join"


class CapsConfig(Strict, frozen=True):
    """What one request or one upstream answer may make the gateway hold or do (docs/security.md)."""

    # -- upstream answers --
    # A buffered upstream body, counted after gzip/deflate decoding (a decompression bomb stops here).
    upstream_body_bytes: Annotated[int, Meta(ge=1024)] = 64 * 1024 * 1024
    # One stream line or event (SSE, NDJSON), after decoding.
    upstream_event_bytes: Annotated[int, Meta(ge=1024)] = 1024 * 1024
    # The status line and headers of one upstream answer.
    upstream_header_bytes: Annotated[int, Meta(ge=1024)] = 64 * 1024
    # Upstream error text relayed to a client or a log, after secrets are scrubbed from it.
    upstream_message_chars: Annotated[int, Meta(ge=64)] = 1000
    # -- client requests --
    request_body_bytes: Annotated[int, Meta(ge=1024)] = 8 * 1024 * 1024
    # Nesting of JSON values inside free-form fields (`response_format`, `inference_extra_params`, ...).
    json_depth: Annotated[int, Meta(ge=2, le=1000)] = 64
    # A client-supplied pattern (`guided_regex`, a JSON-schema `pattern`), in characters.
    pattern_chars: Annotated[int, Meta(ge=16)] = 4096
    # Stop sequences the gateway enforces itself (beyond a provider's count, or kept where it strips them),
    # in characters together: their automaton is built from them once per request.
    stop_chars: Annotated[int, Meta(ge=16)] = 8 * 1024
    # Keyword evaluations (about 10 us each) one request may spend checking its answers against a client's
    # JSON Schema (`guided_json`, `response_format`): all its choices and retries together.
    guided_work: Annotated[int, Meta(ge=1000)] = 200_000
    # The most subschemas a client's schema may apply to one value through `$ref`s and in-place branches
    # (`anyOf`, `allOf`, `oneOf`, `not`, `if`): shared `$ref` targets multiply them.
    schema_paths: Annotated[int, Meta(ge=1)] = 1000
    # The text an emulated answer may build (echo x n x prompts, best_of fan-outs), in bytes.
    emulated_answer_bytes: Annotated[int, Meta(ge=1024)] = 16 * 1024 * 1024
    # Tokens the built-in `fake` provider generates for one choice.
    fake_max_tokens: Annotated[int, Meta(ge=1)] = 4096


Transport = Literal["auto", "h1", "httpx"]


class DiscoveryConfig(Strict, frozen=True):
    """GET /v1/models lists what upstreams say they serve, refreshed in the background (docs/clients.md)."""

    enabled: bool = True
    # How often each provider's list is asked for again; a failed refresh keeps the last good list.
    ttl_ms: Annotated[int, Meta(ge=100)] = 60_000
    # One listing request, connect to last byte.
    timeout_ms: Annotated[int, Meta(gt=0)] = 5_000
    # Providers asked at the same time.
    concurrency: Annotated[int, Meta(ge=1, le=64)] = 4
    # Model ids kept per provider; an upstream answering more is cut here.
    max_models: Annotated[int, Meta(ge=1, le=100_000)] = 10_000


class DeploymentConfig(Strict, frozen=True):
    base_url: str | None = None
    api_key: str | None = None
    api_version: str | None = None
    # The upstream's own name for it (Azure deployment id) when it differs from the config key.
    name: str | None = None
    limits: LimitsConfig | None = None


class ProviderConfig(Strict, frozen=True):
    # A key of providers/registry.py REGISTRY; checked when the file is loaded (`_check_kind`).
    kind: str
    api_key: str | None = None
    base_url: str | None = None
    api_version: str | None = None
    deployments: dict[str, DeploymentConfig] = msgspec.field(default_factory=dict)
    # Advertised in GET /v1/models; routing does not require a model to be listed.
    models: list[str] = msgspec.field(default_factory=list)
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    # For providers that require a token limit (Anthropic): used when the request gives none.
    default_max_tokens: Annotated[int, Meta(ge=1)] | None = None
    # The largest logprobs count this server returns, when it differs from its kind's default (vLLM's
    # `--max-logprobs`, 20 by default; TGI's `--max-top-n-tokens`, 5): larger counts are refused naming it.
    # Up to MAX_LOGPROBS, the absolute bound every request is decoded with.
    max_logprobs: Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)] | None = None
    # AWS region (`us-east-1`) for kind bedrock: the endpoint host and the SigV4 credential scope.
    # Empty is allowed here so an unset `${VAR}` does not fail the load; such a provider refuses requests.
    region: Annotated[str, Meta(pattern=r"^$|^[a-z]{2}(-[a-z]+)+-\d+$")] | None = None
    unsupported_params: ParamPolicy | None = None
    timeouts: TimeoutsConfig | None = None
    retries: RetriesConfig | None = None
    # The upstream's own quota, enforced by the gateway so replicas stop before the upstream refuses.
    limits: LimitsConfig | None = None
    # Per-pool connection cap; keep-alive connections are reused across requests.
    max_connections: Annotated[int, Meta(ge=1)] = 256
    # The upstream HTTP client: `h1` (the fast built-in HTTP/1.1 client), `httpx`, or `auto` (h1 unless
    # a proxy, a CA bundle, a client certificate or HTTP/2 below needs httpx).
    transport: Transport = "auto"
    # An HTTP(S) proxy URL for this provider; unset: HTTPS_PROXY / HTTP_PROXY / NO_PROXY from the environment.
    proxy: str | None = None
    # PEM file of CA certificates trusted for this provider instead of the system store.
    ca_bundle: str | None = None
    # mTLS: PEM client certificate and its key (the key may be in the certificate file).
    client_cert: str | None = None
    client_key: str | None = None
    http2: bool = False
    # Root URL of the server's tokenizer routes (/tokenize, /detokenize, /tokenizer_info) when they are not
    # where they usually are: `base_url` without a trailing `/v1` (docs/clients.md).
    tokenizer_url: str | None = None
    # Ask the upstream which models it serves, for GET /v1/models (gateway/discovery.py). Unset: the kind's
    # default, on for self-hosted servers (vllm, llamacpp, tgi, ollama), off for hosted catalogs.
    discover: bool | None = None
    # A self-hosted engine run as several replicas serving the same models, instead of one base_url: URLs,
    # or {url, weight, drain}. Each is its own target (`<provider>@<i>`); docs/fleets.md.
    replicas: list[str | ReplicaConfig] = msgspec.field(default_factory=list)
    # Which replica serves each request (needs replicas:); unset: round robin.
    routing: RoutingConfig | None = None


class TargetConfig(Strict, frozen=True):
    model: str
    weight: Annotated[float, Meta(gt=0)] = 1.0


class AliasConfig(Strict, frozen=True):
    name: str
    targets: Annotated[list[TargetConfig], Meta(min_length=1)]
    strategy: Strategy = "weighted"
    # Other aliases or vendor/model strings, tried in order after every target has failed.
    fallbacks: list[str] = msgspec.field(default_factory=list)
    # Larger-context models to go to when a target answers that the prompt does not fit.
    context_window_fallbacks: list[str] = msgspec.field(default_factory=list)
    resume_streams: bool = False
    hedge_after_ms: Annotated[int, Meta(gt=0)] | None = None
    retries: RetriesConfig | None = None
    timeouts: TimeoutsConfig | None = None
    limits: LimitsConfig | None = None


class TokenizerConfig(Strict, frozen=True):
    # The model (an alias or vendor/model) of a bare /tokenize, /detokenize or /tokenizer_info request that
    # names none, as lm-eval's remote tokenizer never does; empty: such a request is a 400 naming `model`.
    default_model: str = ""


class GatewayConfig(Strict, frozen=True):
    server: ServerConfig = ServerConfig()
    redis: RedisConfig = RedisConfig()
    unsupported_params: ParamPolicy = "error"
    logging: LoggingConfig = LoggingConfig()
    # Re-asks after an emulated guided_* answer fails validation, before answering 502.
    guided_retries: Annotated[int, Meta(ge=0, le=10)] = 2
    timeouts: TimeoutsConfig = TimeoutsConfig()
    retries: RetriesConfig = RetriesConfig()
    cooldown: CooldownConfig = CooldownConfig()
    keys: list[KeyConfig] = msgspec.field(default_factory=list)
    providers: dict[str, Any] = msgspec.field(default_factory=dict)
    models: list[AliasConfig] = msgspec.field(default_factory=list)
    # Model string (exact, or a glob) -> price; see docs/operations.md for how a request's price is found.
    prices: dict[str, PriceConfig] = msgspec.field(default_factory=dict)
    admin: AdminConfig = AdminConfig()
    metrics: MetricsConfig = MetricsConfig()
    tracing: TracingConfig = TracingConfig()
    caps: CapsConfig = CapsConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()


class LoadedConfig(msgspec.Struct, frozen=True):
    """A validated config plus what could not be resolved from the environment."""

    source: str
    config: GatewayConfig
    providers: dict[str, ProviderConfig]
    # YAML path (`providers.openai.api_key`) -> names of the unset variables it referenced.
    missing_env: dict[str, list[str]]

    def missing_for(self, prefix: str) -> list[str]:
        found: list[str] = []
        for path, names in self.missing_env.items():
            if path == prefix or path.startswith(prefix + "."):
                found.extend(names)
        return found


class ConfigError(Exception):
    """One line: `<file>: <yaml path>: <problem>`."""


def _tls_problem(p: ProviderConfig) -> tuple[str, str] | None:
    """The field and the reason when the provider's CA bundle or client certificate cannot be loaded, as the
    transport would load them: found here, at load time, not when a (re)load builds the pipeline."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if p.ca_bundle:
            ctx.load_verify_locations(cafile=p.ca_bundle)
    except (ssl.SSLError, OSError) as exc:
        return "ca_bundle", f"cannot be loaded as PEM CA certificates ({_ssl_reason(exc)})"
    try:
        if p.client_cert:
            # An encrypted key would prompt on a terminal: refused like any other unreadable key.
            ctx.load_cert_chain(p.client_cert, p.client_key or None, password=lambda: b"")
    except (ssl.SSLError, OSError) as exc:
        return "client_cert", f"cannot be loaded with its key as PEM ({_ssl_reason(exc)})"
    return None


def _ssl_reason(exc: ssl.SSLError | OSError) -> str:
    return str(getattr(exc, "reason", None) or exc.strerror or type(exc).__name__)


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_MSGSPEC_PATH = re.compile(r"^(.*?)(?: - at `\$(.*)`)?$", re.DOTALL)


def _interpolate(node: Any, path: str, env: dict[str, str], missing: dict[str, list[str]]) -> Any:
    if isinstance(node, str):
        unset: list[str] = []

        def sub(m: re.Match[str]) -> str:
            value = env.get(m.group(1))
            if value:
                return value
            if m.group(2) is not None:
                return m.group(2)
            unset.append(m.group(1))
            return ""

        out = _VAR.sub(sub, node)
        if unset:
            missing[path] = unset
        return out
    if isinstance(node, dict):
        return {k: _interpolate(v, f"{path}.{k}" if path else str(k), env, missing) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, f"{path}[{i}]", env, missing) for i, v in enumerate(node)]
    return node


def _convert(obj: Any, typ: type[Any], where: str, source: str) -> Any:
    try:
        return msgspec.convert(obj, typ, strict=True)
    except msgspec.ValidationError as exc:
        m = _MSGSPEC_PATH.match(str(exc))
        assert m is not None
        problem, sub = m.group(1), (m.group(2) or "")
        unknown = re.match(r"Object contains unknown field `([^`]+)`", problem)
        if unknown:
            sub, problem = f"{sub}.{unknown.group(1)}", "unknown key"
        missing = re.match(r"Object missing required field `([^`]+)`", problem)
        if missing:
            sub, problem = f"{sub}.{missing.group(1)}", "required key is missing"
        path = (where + sub) if where else sub.lstrip(".")
        raise ConfigError(f"{source}: {path.lstrip('.') or '(top level)'}: {problem}") from None


def _check_kind(p: ProviderConfig, path: str, source: str) -> None:
    if p.kind not in REGISTRY:
        raise ConfigError(f"{source}: {path}.kind: Invalid enum value {p.kind!r}; valid kinds: {', '.join(kinds())}")


def _check(cfg: GatewayConfig, providers: dict[str, ProviderConfig], source: str) -> None:
    def fail(path: str, problem: str) -> None:
        raise ConfigError(f"{source}: {path}: {problem}")

    if cfg.redis.url and (problem := url_problem(cfg.redis.url)) is not None:
        fail("redis.url", problem)  # one line naming the option; never the URL (it may hold a password)
    for name, p in providers.items():
        if "/" in name or not name:
            fail(f"providers.{name}", "a provider name may not be empty or contain '/'")
        adapter = REGISTRY[p.kind]
        if (
            fleet := fleet_problem(name, p.replicas, p.routing, p.base_url, adapter.serves_replicas, p.kind)
        ) is not None:
            fail(*fleet)
        if adapter.needs_base_url and not p.base_url and not p.replicas:
            if not p.deployments or any(not d.base_url for d in p.deployments.values()):
                fail(f"providers.{name}.base_url", f"required for kind '{p.kind}'")
        if adapter.needs_region and p.region is None:
            fail(f"providers.{name}.region", f"required for kind '{p.kind}'")
        for url_path, url in (
            [(f"providers.{name}.base_url", p.base_url)]
            + [(f"providers.{name}.deployments.{d}.base_url", dc.base_url) for d, dc in p.deployments.items()]
            + [(f"providers.{name}.tokenizer_url", p.tokenizer_url)]
            + [(f"providers.{name}.replicas[{i}]", replica_url(r)) for i, r in enumerate(p.replicas)]
        ):
            if url and _userinfo(url):
                # The transports would disagree on it (httpx sends it as Basic auth in place of the key, h1
                # drops it): the credential goes where the kind puts it. Never echo the URL: it holds one.
                fail(url_path, "must not carry credentials (user:password@); set api_key (or a headers: entry)")
            if url and not url.startswith(("http://", "https://")):
                fail(url_path, f"must start with http:// or https://, got {url!r}")
        if p.tokenizer_url and not p.tokenizer_url.startswith(("http://", "https://")):
            fail(f"providers.{name}.tokenizer_url", f"must start with http:// or https://, got {p.tokenizer_url!r}")
        if p.transport == "h1":  # h1 has no proxy, CA, client certificate or HTTP/2 support: refuse, not ignore
            for field in ("proxy", "ca_bundle", "client_cert", "client_key", "http2"):
                if getattr(p, field):
                    fail(f"providers.{name}.{field}", "needs transport httpx (or auto); h1 cannot honour it")
        if p.proxy and not p.proxy.startswith(("http://", "https://")):
            fail(f"providers.{name}.proxy", "must start with http:// or https://")  # the URL may hold credentials
        if p.discover and adapter.model_listing is None:
            fail(f"providers.{name}.discover", f"kind '{p.kind}' has no model listing the gateway can read")
        if p.client_key and not p.client_cert:
            fail(f"providers.{name}.client_key", "needs client_cert")
        for field in ("ca_bundle", "client_cert", "client_key"):
            if getattr(p, field) and not os.path.isfile(getattr(p, field)):
                fail(f"providers.{name}.{field}", f"no such file: {getattr(p, field)!r}")
        if (tls := _tls_problem(p)) is not None:
            fail(f"providers.{name}.{tls[0]}", tls[1])
    seen_alias: set[str] = set()
    for i, alias in enumerate(cfg.models):
        if alias.name in seen_alias:
            fail(f"models[{i}].name", f"duplicate alias {alias.name!r}")
        seen_alias.add(alias.name)
    for i, alias in enumerate(cfg.models):
        for j, target in enumerate(alias.targets):
            vendor, _, rest = target.model.partition("/")
            if target.model in seen_alias and (vendor not in providers or not rest):
                # The router resolves targets as vendor/model_name only; an alias of aliases would fail there.
                fail(f"models[{i}].targets[{j}].model", f"{target.model!r} is an alias, not vendor/model_name")
            if vendor not in providers:
                fail(f"models[{i}].targets[{j}].model", f"unknown provider {vendor!r} in {target.model!r}")
            if not rest:
                fail(f"models[{i}].targets[{j}].model", f"expected vendor/model_name, got {target.model!r}")
    for i, alias in enumerate(cfg.models):
        for field in ("fallbacks", "context_window_fallbacks"):
            for j, ref in enumerate(getattr(alias, field)):
                if ref in seen_alias:
                    continue
                vendor, _, rest = ref.partition("/")
                if vendor not in providers or not rest:
                    fail(f"models[{i}].{field}[{j}]", f"{ref!r} is neither an alias nor vendor/model_name")
    default = cfg.tokenizer.default_model
    if default and default not in seen_alias and (default.partition("/")[0] not in providers or "/" not in default):
        fail("tokenizer.default_model", f"{default!r} is neither an alias nor vendor/model_name")
    seen_names: set[str] = set()
    for i, key in enumerate(cfg.keys):
        if key.name in seen_names:
            fail(f"keys[{i}].name", f"duplicate key name {key.name!r}")
        seen_names.add(key.name)


def parse_config(text: str, source: str = "config.yaml", env: dict[str, str] | None = None) -> LoadedConfig:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(yaml)"
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{source}: {where}: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: (top level): expected a mapping, got {type(raw).__name__}")
    missing: dict[str, list[str]] = {}
    data = _interpolate(raw, "", dict(os.environ) if env is None else env, missing)
    if isinstance(data.get("prices"), dict):
        for model, price in data["prices"].items():  # one by one, so an error names the model
            _convert(price, PriceConfig, f"prices.{model}", source)
    cfg: GatewayConfig = _convert(data, GatewayConfig, "", source)
    providers: dict[str, ProviderConfig] = {}
    for name, pdata in cfg.providers.items():
        deployments = pdata.get("deployments") if isinstance(pdata, dict) else None
        if isinstance(deployments, dict):
            # One by one, so an error names the deployment (msgspec reports a dict key as `[...]`).
            for dname, ddata in deployments.items():
                _convert(ddata, DeploymentConfig, f"providers.{name}.deployments.{dname}", source)
        providers[str(name)] = _convert(pdata, ProviderConfig, f"providers.{name}", source)
        _check_kind(providers[str(name)], f"providers.{name}", source)
    _check(cfg, providers, source)
    return LoadedConfig(source=source, config=cfg, providers=providers, missing_env=missing)


def _userinfo(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.username is not None or parts.password is not None


def load_config(path: str | Path, env: dict[str, str] | None = None, *, strict: bool = False) -> LoadedConfig:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: (file): {exc.strerror or exc}") from None
    loaded = parse_config(text, str(p), env)
    if strict and loaded.missing_env:
        path_, names = next(iter(loaded.missing_env.items()))
        raise ConfigError(f"{p}: {path_}: environment variable {names[0]} is not set")
    return loaded
