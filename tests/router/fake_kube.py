"""A fake Kubernetes API server: pod and custom-resource list and watch, enough for the
official client.

``GET /api/v1/namespaces/{ns}/pods`` lists (with ``labelSelector`` of ``k=v`` pairs) or, with
``watch=true``, streams JSON-lines events newer than ``resourceVersion`` until
``timeoutSeconds``. ``GET /apis/{group}/{version}/namespaces/{ns}/{plural}`` does the same for
custom resources (``CustomObjectsApi``); a group/version/plural no object was ever put under
answers 404, as for a CRD that is not installed. Tests change objects with ``put``/``delete``;
``silent=True`` changes the state without an event (a watch that missed it), ``compact()``
makes old versions answer 410 Gone.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from kvstack.stack.ports import free_port


def pod(
    name: str,
    ip: str = "127.0.0.1",
    ready: bool = True,
    deleting: bool = False,
    labels: dict[str, str] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "llm",
        "uid": f"uid-{name}",
        "labels": labels or {"app": "vllm"},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": {"containers": [{"name": "engine", "image": "vllm"}]},
        "status": {
            "phase": phase,
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


class FakeKube:
    def __init__(self) -> None:
        self.port = free_port()
        self.version = 1
        self.compacted = 0
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"pods": {}}  # collection -> name
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.num_lists = 0
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pods(self) -> dict[str, dict[str, Any]]:
        return self.objects["pods"]

    async def put(self, obj: dict[str, Any], silent: bool = False, plural: str = "") -> None:
        """Create or replace a pod, or a custom object of ``plural`` (its apiVersion's)."""
        collection = self._collection(obj, plural)
        kind = (
            "MODIFIED" if obj["metadata"]["name"] in self.objects.get(collection, {}) else "ADDED"
        )
        await self._change(kind, obj, silent, collection)

    async def delete(self, name: str, silent: bool = False, collection: str = "pods") -> None:
        await self._change("DELETED", self.objects[collection][name], silent, collection)

    def install(self, api_version: str, plural: str) -> None:
        """A CRD with no objects yet: its collection lists empty instead of answering 404."""
        self.objects.setdefault(f"{api_version}/{plural}", {})

    @staticmethod
    def _collection(obj: dict[str, Any], plural: str) -> str:
        return f"{obj['apiVersion']}/{plural}" if plural else "pods"

    def compact(self) -> None:
        self.compacted = self.version

    async def _change(
        self, kind: str, obj: dict[str, Any], silent: bool, collection: str = "pods"
    ) -> None:
        self.version += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.version)
        objects = self.objects.setdefault(collection, {})
        if kind == "DELETED":
            objects.pop(obj["metadata"]["name"])
        else:
            objects[obj["metadata"]["name"]] = obj
        if not silent:
            self.events.append((self.version, kind, {**obj, "_collection": collection}))
        async with self._changed:
            self._changed.notify_all()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[FakeKube]:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._pods)
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/{plural}", self._custom)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        try:
            yield self
        finally:
            await self._runner.cleanup()

    def _selected(self, obj: dict[str, Any], selector: str) -> bool:
        labels = obj["metadata"].get("labels", {})
        pairs = [p.split("=", 1) for p in selector.split(",") if p]
        return all(labels.get(k) == v for k, v in pairs)

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        return await self._collection_answer(request, "pods", "PodList", "v1")

    async def _custom(self, request: web.Request) -> web.StreamResponse:
        info = request.match_info
        api_version = f"{info['group']}/{info['version']}"
        collection = f"{api_version}/{info['plural']}"
        if collection not in self.objects:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        return await self._collection_answer(request, collection, "List", api_version)

    async def _collection_answer(
        self, request: web.Request, collection: str, list_kind: str, api_version: str
    ) -> web.StreamResponse:
        selector = request.query.get("labelSelector", "")
        if request.query.get("watch") in ("true", "True", "1"):
            return await self._watch(request, selector, collection)
        self.num_lists += 1
        objects = self.objects[collection].values()
        items = [p for p in objects if self._selected(p, selector)]
        return web.json_response(
            {
                "kind": list_kind,
                "apiVersion": api_version,
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }
        )

    async def _watch(
        self, request: web.Request, selector: str, collection: str = "pods"
    ) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or 0)
        deadline = asyncio.get_running_loop().time() + float(request.query.get("timeoutSeconds", 5))
        response = web.StreamResponse(headers={"content-type": "application/json"})
        await response.prepare(request)
        if since < self.compacted:
            gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return response
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            for version, kind, event in self.events:
                obj = {k: v for k, v in event.items() if k != "_collection"}
                mine = event["_collection"] == collection and self._selected(obj, selector)
                if version > since and mine:
                    await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
            since = max([since] + [v for v, _, _ in self.events])
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except TimeoutError:
                    break
        return response
