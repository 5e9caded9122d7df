"""Backend discovery: where the backend list comes from (``discovery.kind``)."""

from __future__ import annotations

from kvstack.registry import Registry
from kvstack.router.config import RouterConfig
from kvstack.router.fleet.discovery.base import Discovery, Publish

__all__ = ["DISCOVERY", "Discovery", "Publish", "make_discovery"]

DISCOVERY: Registry[type[Discovery]] = Registry("discovery kind")
DISCOVERY.register("static", "kvstack.router.fleet.discovery.static:StaticDiscovery")
DISCOVERY.register("kubernetes", "kvstack.router.fleet.discovery.kubernetes:KubernetesDiscovery")


def make_discovery(config: RouterConfig) -> Discovery:
    return DISCOVERY.get(config.discovery.kind).from_config(config)
