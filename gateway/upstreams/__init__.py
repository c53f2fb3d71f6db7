"""Upstream adapters: how each kind of engine takes a cache salt and reports cached tokens."""

from gateway.upstreams.base import CacheReport, UpstreamAdapter, UsageReport
from gateway.upstreams.registry import adapter_for

__all__ = ["CacheReport", "UpstreamAdapter", "UsageReport", "adapter_for"]
