"""Static discovery: the ``backends`` list from the config, published once."""

from __future__ import annotations

from collections.abc import Sequence

from kvstack.redact import redact_url
from kvstack.router.config import RouterConfig
from kvstack.router.fleet.backends import Backend
from kvstack.router.fleet.config import BackendConfig
from kvstack.router.fleet.discovery.base import Discovery, Publish

__all__ = ["StaticDiscovery", "backend_from_config"]


def backend_from_config(config: BackendConfig) -> Backend:
    models = None if config.models is None else frozenset(config.models)
    return Backend(
        id=config.name or redact_url(config.url),  # the id labels metrics and headers
        url=config.url,
        role=config.role,
        labels=dict(config.labels),
        static_models=models,
    )


class StaticDiscovery(Discovery):
    def __init__(self, backends: Sequence[Backend]) -> None:
        self.backends = list(backends)

    @classmethod
    def from_config(cls, config: RouterConfig) -> StaticDiscovery:
        return cls([backend_from_config(b) for b in config.backends])

    async def start(self, publish: Publish) -> None:
        publish(self.backends)

    async def close(self) -> None:
        return None
