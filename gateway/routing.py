"""Model -> upstream routing, with everything per upstream precomputed at start-up (`gateway.upstreams.route`)."""

from __future__ import annotations

from gateway.config import GatewayConfig
from gateway.replicas.replica_set import ReplicaSet
from gateway.upstreams.route import Route, build_route


class Router:
    """Picks the upstream for a model: an explicit route, else the default upstream. Upstreams with replicas get a
    `ReplicaSet` (`replica_sets[name]`) that picks the replica for each request."""

    def __init__(self, config: GatewayConfig) -> None:
        self.routes = {u.name: build_route(u) for u in config.upstreams}
        self._by_model = {model: self.routes[name] for model, name in config.routes.items()}
        self._default = self.routes[config.default_upstream]
        self.replica_sets = {u.name: ReplicaSet(u) for u in config.upstreams if u.replicas}

    async def start(self) -> None:
        for replica_set in self.replica_sets.values():
            await replica_set.start()

    async def stop(self) -> None:
        for replica_set in self.replica_sets.values():
            await replica_set.stop()

    def route(self, model: str) -> Route:
        return self._by_model.get(model, self._default)

    @property
    def default(self) -> Route:
        return self._default
