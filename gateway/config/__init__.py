"""The ops' YAML config, typed with msgspec and checked once at start-up.

`schema` holds the typed blocks (what each key means and its default: docs/config.md is generated from
them); `loading` reads a file into a `LoadedConfig`, resolving `${VAR}` references and checking what no
single block can (a bad config is one `ConfigError` line). Importers take names from `gateway.config`.

May import the base below it (state, ids), providers (the registry) and wire; nothing else of gateway.
"""

from gateway.config.fleet import (
    ReplicaConfig,
    RoutingConfig,
    fleet_problem,
    replica_drained,
    replica_names,
    replica_url,
    replica_weight,
)
from gateway.config.loading import ConfigError, LoadedConfig, load_config, parse_config
from gateway.config.schema import (
    AdminConfig,
    AliasConfig,
    CacheConfig,
    CapsConfig,
    CooldownConfig,
    DeploymentConfig,
    DiscoveryConfig,
    GatewayConfig,
    KeyConfig,
    LimitsConfig,
    LoggingConfig,
    MetricsConfig,
    ParamPolicy,
    PriceConfig,
    ProviderConfig,
    RedisConfig,
    RetriesConfig,
    ServerConfig,
    Strategy,
    Strict,
    TargetConfig,
    TimeoutsConfig,
    TokenizerConfig,
    TracingConfig,
    Transport,
    same_target_of,
)

__all__ = [
    "replica_weight",
    "replica_url",
    "replica_names",
    "replica_drained",
    "fleet_problem",
    "RoutingConfig",
    "ReplicaConfig",
    "AdminConfig",
    "AliasConfig",
    "CacheConfig",
    "CapsConfig",
    "ConfigError",
    "CooldownConfig",
    "DeploymentConfig",
    "DiscoveryConfig",
    "GatewayConfig",
    "KeyConfig",
    "LimitsConfig",
    "LoadedConfig",
    "LoggingConfig",
    "MetricsConfig",
    "ParamPolicy",
    "PriceConfig",
    "ProviderConfig",
    "RedisConfig",
    "RetriesConfig",
    "ServerConfig",
    "Strategy",
    "Strict",
    "TargetConfig",
    "TimeoutsConfig",
    "TokenizerConfig",
    "TracingConfig",
    "Transport",
    "load_config",
    "parse_config",
    "same_target_of",
]
