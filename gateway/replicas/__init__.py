"""Replica sets: one upstream served by several engines, with cache-aware routing, health checks and failover."""
