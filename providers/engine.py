"""What an engine server says about its own load: the Prometheus gauges a fleet reads (gateway/fleet).

A declaration per adapter (`engine_gauges`): where the exposition is (relative to the server root) and
which series give the waiting queue, the running batch and the KV-cache usage. Alternatives are listed
because the servers renamed them across versions; the first one present wins.
"""

from __future__ import annotations

import msgspec


class EngineGauges(msgspec.Struct, frozen=True):
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    kv_usage: tuple[str, ...] = ()
    path: str = "/metrics"


VLLM_GAUGES = EngineGauges(
    waiting=("vllm:num_requests_waiting",),
    running=("vllm:num_requests_running",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
)
SGLANG_GAUGES = EngineGauges(
    waiting=("sglang:num_queue_reqs",),
    running=("sglang:num_running_reqs",),
    kv_usage=("sglang:token_usage",),
)
# llama.cpp's server with `--metrics`.
LLAMACPP_GAUGES = EngineGauges(
    waiting=("llamacpp:requests_deferred",),
    running=("llamacpp:requests_processing",),
    kv_usage=("llamacpp:kv_cache_usage_ratio",),
)

__all__ = ["LLAMACPP_GAUGES", "SGLANG_GAUGES", "VLLM_GAUGES", "EngineGauges"]
