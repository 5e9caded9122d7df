"""``ResourceWatch``: custom resources followed with the official client, as snapshots.

The same shape as the router's pod discovery (:mod:`kvstack.router.fleet.discovery.kubernetes`):
a worker thread lists the objects, hands the whole snapshot to a callback on the event loop,
watches from the list's ``resourceVersion``, and re-lists every ``relist_interval_s`` and after
a 410 Gone or an error, so a missed event is repaired by the next snapshot. The first list
happens in ``start``: an API server that does not serve the group/version (the CRD is not
installed, or installed at another version) fails the start with a message that says so.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kvstack.errors import ConfigError
from kvstack.log import IncidentLogger
from kvstack.router.epp.config import PoolConfig
from kvstack.router.fleet.discovery.kubernetes import kube_api_client

__all__ = ["ResourceKind", "ResourceWatch", "Snapshot", "make_api_client"]

log = logging.getLogger(__name__)
incidents = IncidentLogger(log)
Snapshot = Mapping[str, Mapping[str, Any]]  # object name -> object (as the API returns JSON)


class ResourceKind:
    """A custom resource's kind, group/version and plural, as the API addresses it."""

    def __init__(self, kind: str, api_version: str, plural: str) -> None:
        self.kind = kind
        self.api_version = api_version
        self.group, _, self.version = api_version.partition("/")
        self.plural = plural

    def __str__(self) -> str:
        return f"{self.kind} ({self.api_version})"


def make_api_client(config: PoolConfig) -> Any:
    return kube_api_client(config.api_url, config.kubeconfig)


class ResourceWatch:
    """``on_snapshot`` (called on the loop) gets every object of ``kind`` in the namespace."""

    def __init__(
        self,
        kind: ResourceKind,
        config: PoolConfig,
        on_snapshot: Callable[[Snapshot], None],
        api_client: Any = None,
    ) -> None:
        self.kind = kind
        self.config = config
        self.on_snapshot = on_snapshot
        self._api_client = api_client
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        from kubernetes import client

        self._loop = asyncio.get_running_loop()
        api_client = self._api_client or await asyncio.to_thread(make_api_client, self.config)
        api = client.CustomObjectsApi(api_client)
        first = await asyncio.to_thread(self._list, api, False)  # fails when not served
        self.on_snapshot(dict(first[0]))  # the first snapshot is applied before start returns
        self._thread = threading.Thread(
            target=self._run, args=(api, first), name=f"epp-watch-{self.kind.plural}", daemon=True
        )
        self._thread.start()

    async def close(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 2.0)

    def _list(self, api: Any, emit: bool = True) -> tuple[dict[str, Any], str]:
        from kubernetes.client.exceptions import ApiException

        kind = self.kind
        try:
            listed = api.list_namespaced_custom_object(
                kind.group, kind.version, self.config.namespace, kind.plural
            )
        except ApiException as exc:
            if exc.status == 404:
                raise ConfigError(
                    f"the Kubernetes API does not serve {kind.plural} in {kind.api_version}: "
                    f"is the Gateway API Inference Extension CRD installed at that version? "
                    f"(epp.pool: set the API version the cluster serves)"
                ) from None
            raise
        items = {o["metadata"]["name"]: o for o in listed.get("items", [])}
        self._check_versions(items)
        if emit:
            self._emit(items)
        return items, str(listed.get("metadata", {}).get("resourceVersion", ""))

    def _check_versions(self, items: Mapping[str, Mapping[str, Any]]) -> None:
        for name, obj in items.items():
            version = obj.get("apiVersion", self.kind.api_version)
            if version != self.kind.api_version:
                raise ConfigError(
                    f"{self.kind.kind} {name} has API version {version!r}; expected "
                    f"{self.kind.api_version}"
                )

    # -- worker thread
    def _run(self, api: Any, first: tuple[dict[str, Any], str]) -> None:
        backoff_s, listed = 0.5, first
        while not self._stop.is_set():
            try:
                self._watch_from(api, *listed)
                backoff_s = 0.5
            except Exception as exc:  # the thread's boundary: log, back off, list again
                if getattr(exc, "status", None) != 410:
                    incidents.warning("k8s", "%s watch failed (%s); retrying", self.kind, exc)
                    self._stop.wait(backoff_s)
                    backoff_s = min(30.0, backoff_s * 2)
            if self._stop.is_set():
                return
            try:
                listed = self._list(api)
            except Exception as exc:  # as above
                incidents.warning("k8s", "%s list failed (%s); retrying", self.kind, exc)
                self._stop.wait(backoff_s)

    def _watch_from(self, api: Any, snapshot: dict[str, Any], version: str) -> None:
        from kubernetes import watch

        kind, cfg = self.kind, self.config
        deadline = time.monotonic() + cfg.relist_interval_s
        while not self._stop.is_set() and (remaining := deadline - time.monotonic()) > 0:
            self._watch = watch.Watch()
            for event in self._watch.stream(
                api.list_namespaced_custom_object,
                kind.group, kind.version, cfg.namespace, kind.plural,
                resource_version=version,
                timeout_seconds=max(1, int(min(cfg.watch_timeout_s, remaining))),
                allow_watch_bookmarks=True,
            ):  # fmt: skip
                if self._stop.is_set():
                    self._watch.stop()
                    return
                version = self._watch.resource_version or version
                obj = event["object"]
                if event["type"] in ("ADDED", "MODIFIED"):
                    self._check_versions({obj["metadata"]["name"]: obj})
                    snapshot[obj["metadata"]["name"]] = obj
                elif event["type"] == "DELETED":
                    snapshot.pop(obj["metadata"]["name"], None)
                else:
                    continue  # BOOKMARK
                self._emit(snapshot)

    def _emit(self, snapshot: Mapping[str, Any]) -> None:
        if self._loop is None:
            return
        copy = dict(snapshot)
        try:
            self._loop.call_soon_threadsafe(self.on_snapshot, copy)
        except RuntimeError:  # the loop closed during shutdown
            self._stop.set()
