"""Loading the ops' YAML config: parsed, `${VAR}` references resolved, typed, checked once at start-up.

A bad config raises `ConfigError`, whose text is one line naming the file, the YAML path and the
problem; the CLI prints it and exits 1, never a traceback. Secrets are written as `${VAR}` references
and resolved here; a reference to an unset variable does not fail the load (unless `strict`): the
provider or key using it is marked unavailable and requests to it fail fast naming the variable.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import yaml

from gateway.config.consistency import block_problem, model_warnings, name_problem, non_finite
from gateway.config.fleet import fleet_problem, replica_url
from gateway.config.schema import DeploymentConfig, GatewayConfig, PriceConfig, ProviderConfig
from gateway.state import MISPLACED_CREDENTIAL, credential_misplaced, url_problem
from providers.base import Param
from providers.registry import REGISTRY, kinds

log = logging.getLogger("gateway")


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


def ledger_target(url: str) -> tuple[str, str]:
    """(engine, target) of `ledger.url`: a SQLite file path or a PostgreSQL connection string; ValueError
    names the problem. The one check of the URL's form, run by every load (`serve`, `check-config`, a reload)
    and by the ledger's engine (gateway/ledger/engine.py)."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        if not path:
            raise ValueError("sqlite:/// needs a file path (sqlite:///ledger.db, sqlite:////var/lib/gw/ledger.db)")
        return "sqlite", path
    if url.startswith(("postgresql://", "postgres://")):
        if credential_misplaced(url):
            raise ValueError(MISPLACED_CREDENTIAL)
        return "postgresql", url
    # Only the scheme: the rest may hold a password.
    raise ValueError(f"expected sqlite:///<path> or postgresql://..., got {url.split(':', 1)[0]!r}")


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
_MSGSPEC_PATH = re.compile(r"^(.*?)(?: - at (`key` in )?`\$(.*)`)?$", re.DOTALL)


def _interpolate(node: Any, path: str, env: dict[str, str], missing: dict[str, list[str]], refs: dict[str, str]) -> Any:
    """`node` with its `${VAR}` references resolved; `missing` gets each path's unset variables, `refs` the
    first variable each path references (for the errors of a value of the wrong type)."""
    if isinstance(node, str):
        unset: list[str] = []

        def sub(m: re.Match[str]) -> str:
            refs.setdefault(path, m.group(1))
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
        return {k: _interpolate(v, f"{path}.{k}" if path else str(k), env, missing, refs) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, f"{path}[{i}]", env, missing, refs) for i, v in enumerate(node)]
    return node


def _convert(
    obj: Any, typ: type[Any], where: str, source: str, refs: Mapping[str, str], unset: Mapping[str, list[str]]
) -> Any:
    try:
        return msgspec.convert(obj, typ, strict=True)
    except msgspec.ValidationError as exc:
        m = _MSGSPEC_PATH.match(str(exc))
        assert m is not None
        problem, sub = m.group(1), (m.group(3) or "")
        if m.group(2):  # a mapping's key, not its value: YAML reads `5:` as a number, `~:` as null
            problem = f"{problem} for a key (quote it)"
        unknown = re.match(r"Object contains unknown field `([^`]+)`", problem)
        if unknown:
            sub, problem = f"{sub}.{unknown.group(1)}", "unknown key"
        missing = re.match(r"Object missing required field `([^`]+)`", problem)
        if missing:
            sub, problem = f"{sub}.{missing.group(1)}", "required key is missing"
        path = ((where + sub) if where else sub.lstrip(".")).lstrip(".")
        if path in unset:
            problem = f"{problem} (environment variable {unset[path][0]} is not set)"
        elif path in refs and "got `str`" in problem:
            # `port: ${PORT}` is text, whatever PORT holds: such a value is written in the file itself.
            problem = f"{problem} (from ${{{refs[path]}}}: a reference always makes a string)"
        raise ConfigError(f"{source}: {path.lstrip('.') or '(top level)'}: {problem}") from None


def _emulated_n(params: Mapping[str, Param]) -> bool:
    rule = params.get("n")
    return rule is None or rule.emulated


def _check_kind(p: ProviderConfig, path: str, source: str) -> None:
    if p.kind not in REGISTRY:
        raise ConfigError(f"{source}: {path}.kind: Invalid enum value {p.kind!r}; valid kinds: {', '.join(kinds())}")


def _check(
    cfg: GatewayConfig,
    providers: dict[str, ProviderConfig],
    source: str,
    missing: Mapping[str, list[str]],
    data: dict[str, Any],
) -> None:
    def fail(path: str, problem: str) -> None:
        raise ConfigError(f"{source}: {path}: {problem}")

    if cfg.redis.url and (problem := url_problem(cfg.redis.url)) is not None:
        fail("redis.url", problem)  # one line naming the option; never the URL (it may hold a password)
    if cfg.ledger.url:
        try:
            ledger_target(cfg.ledger.url)
        except ValueError as exc:
            fail("ledger.url", str(exc))
    for name, p in providers.items():
        if "/" in name or not name:
            fail(f"providers.{name}", "a provider name may not be empty or contain '/'")
        adapter = REGISTRY[p.kind]
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
            # A URL built from an unset `${VAR}` only makes its provider unavailable, as its key would.
            partial = any(m == url_path or m.startswith(url_path + ".") for m in missing)
            if url and (problem := _endpoint_problem(url, partial)) is not None:
                fail(url_path, problem)
        if (
            fleet := fleet_problem(
                name, p.replicas, p.routing, p.base_url, adapter.serves_replicas, p.kind, bool(p.deployments)
            )
        ) is not None:
            fail(*fleet)
        for header, value in p.headers.items():
            if not _HEADER_NAME.fullmatch(header):
                fail(f"providers.{name}.headers.{header}", "is not a valid HTTP header name")
            if _CONTROL.search(value):
                fail(f"providers.{name}.headers.{header}", f"value {_CONTROL_PROBLEM}")
        for secret_path, secret in [(f"providers.{name}.api_key", p.api_key)] + [
            (f"providers.{name}.deployments.{d}.api_key", dc.api_key) for d, dc in p.deployments.items()
        ]:
            if secret and _CONTROL.search(secret):  # it goes into a header: every request would fail unsent
                fail(secret_path, _CONTROL_PROBLEM)
        if p.transport == "h1":  # h1 has no proxy, CA, client certificate or HTTP/2 support: refuse, not ignore
            for field in ("proxy", "ca_bundle", "client_cert", "client_key", "http2"):
                if getattr(p, field):
                    fail(f"providers.{name}.{field}", "needs transport httpx (or auto); h1 cannot honour it")
        if p.proxy and not p.proxy.startswith(("http://", "https://")):
            fail(f"providers.{name}.proxy", "must start with http:// or https://")  # the URL may hold credentials
        if p.max_n is not None and adapter.opt_in_n is None and _emulated_n(adapter.params):
            fail(f"providers.{name}.max_n", f"kind '{p.kind}' makes one choice per call: the gateway fans out n")
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
        # A team's runtime key goes by `team/name`: a YAML key of that name would share its queue, priority and rows.
        if "/" in key.name:
            fail(f"keys[{i}].name", f"{key.name!r}: a key name may not contain '/' (a team's runtime key is team/name)")
        seen_names.add(key.name)
    # Client keys and team admin keys: each secret is one caller's. One secret would authenticate as whichever
    # came last (another key's limits, budgets and models silently not applied), and a team admin's secret that
    # is also a client key would be both roles. Named by the other holder, never shown.
    held = [(f"keys[{i}].key", key.key, f"key {key.name!r}") for i, key in enumerate(cfg.keys)]
    held += [(f"teams.{n}.admin_key", t.admin_key, f"team {n!r}'s admin_key") for n, t in cfg.teams.items()]
    if cfg.admin.key and "admin.key" not in missing:
        seen_secrets: dict[str, str] = {cfg.admin.key: "admin.key"}
    else:
        seen_secrets = {}
    for path, secret, holder in held:
        if _CONTROL.search(secret):  # a client could never send it in its Authorization header
            fail(path, _CONTROL_PROBLEM)
        if secret and path not in missing:
            if (other := seen_secrets.get(secret)) is not None:
                fail(path, f"the same secret as {other}; each key needs its own")
            seen_secrets[secret] = holder
    if (found := name_problem(cfg, providers) or block_problem(cfg, providers, data)) is not None:
        fail(*found)


# RFC 9110's token, and what no header value may hold (a tab may: it is whitespace there).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_CONTROL_PROBLEM = "contains a line break or another control character (a trailing newline from its file or variable?)"


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error: YAML would keep the last
    silently, and a second `providers:` or `x:` block would replace the first whole. Keys a `<<` merge brings
    in may be overridden, as YAML means them to be."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: SafeLoader says so below
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {str(key)!r} in one mapping", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def parse_config(text: str, source: str = "config.yaml", env: dict[str, str] | None = None) -> LoadedConfig:
    try:
        raw = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader that refuses duplicate keys
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "(yaml)"
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{source}: {where}: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: (top level): expected a mapping, got {type(raw).__name__}")
    missing: dict[str, list[str]] = {}
    refs: dict[str, str] = {}
    data = _interpolate(raw, "", dict(os.environ) if env is None else env, missing, refs)
    if (infinite := non_finite(data)) is not None:
        raise ConfigError(f"{source}: {infinite[0]}: {infinite[1]}")
    if isinstance(data.get("prices"), dict):
        for model, price in data["prices"].items():  # one by one, so an error names the model
            _convert(price, PriceConfig, f"prices.{model}", source, refs, missing)
    _cache_modes(data, source)
    cfg: GatewayConfig = _convert(data, GatewayConfig, "", source, refs, missing)
    providers: dict[str, ProviderConfig] = {}
    for name, pdata in cfg.providers.items():
        deployments = pdata.get("deployments") if isinstance(pdata, dict) else None
        if isinstance(deployments, dict):
            # One by one, so an error names the deployment (msgspec reports a dict key as `[...]`).
            for dname, ddata in deployments.items():
                _convert(ddata, DeploymentConfig, f"providers.{name}.deployments.{dname}", source, refs, missing)
        providers[str(name)] = _convert(pdata, ProviderConfig, f"providers.{name}", source, refs, missing)
        _check_kind(providers[str(name)], f"providers.{name}", source)
    _check(cfg, providers, source, missing, data)
    for path, why in model_warnings(cfg, providers):
        log.warning("%s: %s: %s", source, path, why)  # each load says it: start-up, every worker, a reload
    return LoadedConfig(source=source, config=cfg, providers=providers, missing_env=missing)


def _cache_modes(data: dict[str, Any], source: str) -> None:
    """`mode: off` unquoted, which YAML 1.1 reads as the boolean false (like `no`), means `off`; an unquoted
    `on`, `yes` or `true` (read as true) names no mode (deterministic or always?) and is refused saying so."""
    blocks: list[tuple[str, Any]] = [("cache", data.get("cache"))]
    providers = data.get("providers")
    if isinstance(providers, dict):
        blocks += [(f"providers.{name}.cache", p.get("cache")) for name, p in providers.items() if isinstance(p, dict)]
    models = data.get("models")
    if isinstance(models, list):
        blocks += [(f"models[{i}].cache", m.get("cache")) for i, m in enumerate(models) if isinstance(m, dict)]
    for path, block in blocks:
        if not isinstance(block, dict) or not isinstance(block.get("mode"), bool):
            continue
        if block["mode"]:
            raise ConfigError(
                f"{source}: {path}.mode: YAML reads an unquoted on/yes/true as true, which names no mode; "
                "write deterministic, always or off"
            )
        block["mode"] = "off"


def _endpoint_problem(url: str, partial: bool = False) -> str | None:
    """Why an upstream URL (a base_url, a replica, a tokenizer_url) could never be sent a request, or None:
    found at load, not as a 502 on every request. The URL is echoed only when it cannot hold a secret.
    `partial`: a `${VAR}` in it is unset, so only its scheme and credentials are checked."""
    secretive = "@" in url or "?" in url
    if not url.startswith(("http://", "https://")):
        shown = "" if secretive else f", got {url!r}"
        return f"must start with http:// or https://{shown}"
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        return "must not contain spaces or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return "is not a valid URL" if secretive else f"is not a valid URL ({exc})"
    if parts.username is not None or parts.password is not None:
        # The transports would disagree on it (httpx sends it as Basic auth in place of the key, h1
        # drops it): the credential goes where the kind puts it. Never echo the URL: it holds one.
        return "must not carry credentials (user:password@); set api_key (or a headers: entry)"
    if partial:
        return None
    if not parts.hostname:
        return "has no host"
    if port == 0:
        return "has port 0"
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        # Each request's route is appended to the URL: it would land inside the query.
        return "must not carry a query (?...) or a fragment (#...); set a headers: entry for a credential"
    return None


def read_config(path: str | Path) -> str:
    """The config file's text; a `ConfigError` line when it cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: (file): {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:  # a file saved as Latin-1, say: the line, not the bytes (may be a secret)
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 text") from None


def load_config(path: str | Path, env: dict[str, str] | None = None, *, strict: bool = False) -> LoadedConfig:
    p = Path(path)
    loaded = parse_config(read_config(p), str(p), env)
    if strict and loaded.missing_env:
        path_, names = next(iter(loaded.missing_env.items()))
        raise ConfigError(f"{p}: {path_}: environment variable {names[0]} is not set")
    return loaded
