"""Kubernetes discovery with the official client: list, then watch, with a periodic re-list.

A worker thread (the client is synchronous) lists the pods matching ``label_selector``,
publishes the snapshot, then watches from the list's ``resourceVersion``; every event updates
the snapshot and publishes it again. Every ``relist_interval_s`` (and after a 410 Gone, an
error, or a watch that ended) it lists afresh and *replaces* the snapshot, so a deletion the
watch missed cannot leave a ghost endpoint behind. A pod is a backend only while it is Running
and Ready, has a pod IP and no deletion timestamp.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from kvstack.errors import require
from kvstack.log import IncidentLogger
from kvstack.router.config import RouterConfig
from kvstack.router.fleet.backends import Backend
from kvstack.router.fleet.config import KubernetesConfig
from kvstack.router.fleet.discovery.base import Discovery, Publish

__all__ = ["KubernetesDiscovery", "kube_api_client", "pod_backend"]

log = logging.getLogger(__name__)
incidents = IncidentLogger(log)
_FIRST_LIST_WAIT_S = 10.0


def pod_backend(pod: Any, config: KubernetesConfig) -> Backend | None:
    """The backend a pod stands for, or None if it must not get traffic now."""
    meta, status = pod.metadata, pod.status
    if meta is None or status is None or meta.deletion_timestamp is not None:
        return None
    if not status.pod_ip or status.phase != "Running":
        return None
    if not any(c.type == "Ready" and c.status == "True" for c in status.conditions or ()):
        return None
    host = f"[{status.pod_ip}]" if ":" in status.pod_ip else status.pod_ip
    labels: Mapping[str, str] = meta.labels or {}
    return Backend(
        id=f"{meta.namespace}/{meta.name}",
        url=f"{config.scheme}://{host}:{config.port}",
        role=labels.get(config.role_label, "both"),
        labels=dict(labels),
    )


def kube_api_client(api_url: str | None, kubeconfig: str | None) -> Any:
    """The official client's ``ApiClient``: ``api_url`` (a test's or a proxy's), else the
    kubeconfig file, else the pod's in-cluster service account."""
    require("kubernetes", "k8s")
    from kubernetes import client
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    if api_url:
        configuration.host = api_url
    elif kubeconfig:
        kube_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        kube_config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)


def make_core_api(config: KubernetesConfig) -> Any:
    from kubernetes import client

    return client.CoreV1Api(kube_api_client(config.api_url, config.kubeconfig))


class KubernetesDiscovery(Discovery):
    def __init__(self, config: KubernetesConfig) -> None:
        self.config = config
        self._stop = threading.Event()
        self._listed = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self._publish: Publish | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last: list[Backend] | None = None

    @classmethod
    def from_config(cls, config: RouterConfig) -> KubernetesDiscovery:
        return cls(config.discovery.kubernetes)

    async def start(self, publish: Publish) -> None:
        self._publish = publish
        self._loop = asyncio.get_running_loop()
        api = await asyncio.to_thread(make_core_api, self.config)
        self._thread = threading.Thread(
            target=self._run, args=(api,), name="router-k8s-discovery", daemon=True
        )
        self._thread.start()
        listed = await asyncio.to_thread(self._listed.wait, _FIRST_LIST_WAIT_S)
        if not listed:
            log.warning("no pod list from the Kubernetes API yet; starting without backends")

    async def close(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            # The thread leaves at the latest when its watch request times out (daemon).
            await asyncio.to_thread(self._thread.join, 2.0)

    # -- worker thread
    def _run(self, api: Any) -> None:
        backoff_s = 0.5
        while not self._stop.is_set():
            try:
                self._list_then_watch(api)
                backoff_s = 0.5
            except Exception as exc:  # the thread's boundary: log, back off, list again
                if getattr(exc, "status", None) == 410:
                    continue  # resourceVersion too old: re-list at once
                incidents.warning("k8s", "pod discovery failed (%s); retrying", exc)
                self._stop.wait(backoff_s)
                backoff_s = min(30.0, backoff_s * 2)

    def _list_then_watch(self, api: Any) -> None:
        from kubernetes import watch

        cfg = self.config
        pods = api.list_namespaced_pod(cfg.namespace, label_selector=cfg.label_selector)
        snapshot = {_key(p): p for p in pods.items}
        self._emit(snapshot)
        self._listed.set()
        version = pods.metadata.resource_version
        deadline = time.monotonic() + cfg.relist_interval_s
        while not self._stop.is_set() and (remaining := deadline - time.monotonic()) > 0:
            self._watch = watch.Watch()
            for event in self._watch.stream(
                api.list_namespaced_pod,
                cfg.namespace,
                label_selector=cfg.label_selector,
                resource_version=version,
                timeout_seconds=max(1, int(min(cfg.watch_timeout_s, remaining))),
                allow_watch_bookmarks=True,
            ):
                if self._stop.is_set():
                    self._watch.stop()
                    return
                version = self._watch.resource_version or version
                if event["type"] in ("ADDED", "MODIFIED"):
                    snapshot[_key(event["object"])] = event["object"]
                elif event["type"] == "DELETED":
                    snapshot.pop(_key(event["object"]), None)
                else:
                    continue  # BOOKMARK: only moves the resourceVersion
                self._emit(snapshot)

    def _emit(self, snapshot: Mapping[str, Any]) -> None:
        backends = [b for b in (pod_backend(p, self.config) for p in snapshot.values()) if b]
        backends.sort(key=lambda b: b.id)
        if backends == self._last or self._loop is None or self._publish is None:
            return
        self._last = backends
        try:
            self._loop.call_soon_threadsafe(self._publish, backends)
        except RuntimeError:  # the loop closed during shutdown
            self._stop.set()


def _key(pod: Any) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"
