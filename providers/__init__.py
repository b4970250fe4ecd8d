"""Provider adapters, one module per kind; `REGISTRY` (providers/registry.py) maps a config `kind` to its adapter."""

from __future__ import annotations

from providers.base import Adapter, LocalAdapter
from providers.registry import REGISTRY, register

__all__ = ["REGISTRY", "Adapter", "LocalAdapter", "register"]
