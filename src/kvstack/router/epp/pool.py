"""``InferencePoolDiscovery``: the router's backends are the pods an InferencePool selects.

The pool object (``epp.pool.name``) gives a label selector and the target ports: in
``inference.networking.k8s.io/v1``, ``spec.selector.matchLabels`` and ``spec.targetPorts``
(up to eight ``{number}``, one endpoint per pod and port); in the older
``inference.networking.x-k8s.io/v1alpha2``, ``spec.selector`` (labels) and
``spec.targetPortNumber``. The pods themselves are followed by the router's own Kubernetes
discovery (list, watch, re-list; Running, Ready, with an IP, not terminating), one per target
port, and their snapshots are merged into one. When the pool changes its selector or ports
the pod watches are replaced; a deleted pool publishes no backends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kvstack.errors import ConfigError
from kvstack.router.config import KubernetesConfig, RouterConfig
from kvstack.router.epp.config import PoolConfig
from kvstack.router.epp.kube import ResourceKind, ResourceWatch, Snapshot
from kvstack.router.fleet.backends import Backend
from kvstack.router.fleet.discovery.base import Discovery, Publish
from kvstack.router.fleet.discovery.kubernetes import KubernetesDiscovery

__all__ = ["InferencePoolDiscovery", "PoolTarget", "pool_target"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PoolTarget:
    """What a pool selects: pods by ``selector`` (``k=v,...``), served on ``ports``."""

    selector: str
    ports: tuple[int, ...]


def pool_target(obj: Mapping[str, Any]) -> PoolTarget:
    """The pool's selector and ports, read as its API version defines them."""
    spec = obj.get("spec") or {}
    name = obj.get("metadata", {}).get("name", "?")
    if obj.get("apiVersion") == "inference.networking.x-k8s.io/v1alpha2":
        labels, given = spec.get("selector") or {}, [spec.get("targetPortNumber")]
    else:
        labels = (spec.get("selector") or {}).get("matchLabels") or {}
        given = [p.get("number") for p in spec.get("targetPorts") or []]
    ports = {p for p in given if isinstance(p, int) and 0 < p < 65536}
    if not labels or not ports or len(ports) != len(set(given)):
        raise ConfigError(f"InferencePool {name} needs a label selector and target ports")
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return PoolTarget(selector, tuple(sorted(ports)))


class InferencePoolDiscovery(Discovery):
    def __init__(self, config: PoolConfig, api_client: Any = None) -> None:
        if config.name is None:
            raise ConfigError("epp.pool.name names the InferencePool to follow")
        self.config = config
        self.kind = ResourceKind("InferencePool", config.api_version, "inferencepools")
        self._api_client = api_client
        self._watch = ResourceWatch(self.kind, config, self._on_pools, api_client)
        self._publish: Publish | None = None
        self._target: PoolTarget | None = None
        self._pods: dict[int, KubernetesDiscovery] = {}
        self._by_port: dict[int, list[Backend]] = {}
        self._reconfigured: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def from_config(cls, config: RouterConfig) -> InferencePoolDiscovery:
        raise ConfigError("the InferencePool discovery is built by `kvstack epp` (epp.pool)")

    @property
    def target(self) -> PoolTarget | None:
        return self._target

    async def start(self, publish: Publish) -> None:
        self._publish = publish
        await self._watch.start()  # applies the first snapshot: a pod watch is starting
        if self._reconfigured is not None:
            await self._reconfigured

    async def close(self) -> None:
        await self._watch.close()
        async with self._lock:
            await self._stop_pods()

    def _on_pools(self, pools: Snapshot) -> None:
        obj = pools.get(self.config.name or "")
        try:
            target = pool_target(obj) if obj is not None else None
        except ConfigError as exc:
            log.error("%s; keeping the previous endpoints", exc)
            return
        if target == self._target:
            return
        if obj is None:
            log.warning("InferencePool %s/%s not found", self.config.namespace, self.config.name)
        self._target = target
        self._reconfigured = asyncio.ensure_future(self._follow(target))

    async def _follow(self, target: PoolTarget | None) -> None:
        async with self._lock:
            await self._stop_pods()
            self._emit()
            if target is None:
                return
            for port in target.ports:
                pods = KubernetesDiscovery(self._pod_config(target.selector, port))
                self._pods[port] = pods
                await pods.start(functools.partial(self._on_pods, port))

    def _pod_config(self, selector: str, port: int) -> KubernetesConfig:
        cfg = self.config
        return KubernetesConfig(
            namespace=cfg.namespace, label_selector=selector, port=port, scheme=cfg.scheme,
            role_label=cfg.role_label, relist_interval_s=cfg.relist_interval_s,
            watch_timeout_s=cfg.watch_timeout_s, kubeconfig=cfg.kubeconfig, api_url=cfg.api_url,
        )  # fmt: skip

    async def _stop_pods(self) -> None:
        for pods in self._pods.values():
            await pods.close()
        self._pods.clear()
        self._by_port.clear()

    def _on_pods(self, port: int, backends: Sequence[Backend]) -> None:
        if port not in self._pods:
            return  # a watch being replaced
        many = len(self._target.ports) > 1 if self._target else False
        self._by_port[port] = [
            dataclasses.replace(b, id=f"{b.id}:{port}") if many else b for b in backends
        ]
        self._emit()

    def _emit(self) -> None:
        if self._publish is not None:
            merged = [b for port in sorted(self._by_port) for b in self._by_port[port]]
            self._publish(merged)
