"""The admin HTTP API (a Starlette app the router mounts, e.g. at ``/admin/lora``).

Every route needs ``Authorization: Bearer <admin key>``; ``x-actor`` names who acts in the
audit log. Registry calls run in worker threads; after a change the resolver is refreshed at
once (this router serves the new state immediately) and releases are synced with the engines.

    GET  /adapters[?tenant=]               versions
    POST /adapters                         register {source, adapter_id, version, base_model,
                                           tenant_id, priority_tier}
    GET  /adapters/{id}                    release and versions
    POST /adapters/{id}/promote            {version}
    POST /adapters/{id}/canary             {version, percent}: prewarms, then takes traffic
    POST /adapters/{id}/rollback
    POST /adapters/{id}/disable            {version}
    POST /adapters/{id}/prewarm            {version?, engines?}
    GET  /engines                          residency per engine
    GET  /audit[?adapter_id=&action=&limit=]
    GET  /ttft[?adapter=&start=]           p50/p95/p99 of recent TTFTs
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kvstack.errors import ConfigError, LoRAError, RegistryError, VerificationError
from kvstack.lora.adapters import AdapterVersion, Release
from kvstack.lora.manager import AdapterCacheManager
from kvstack.lora.plane import ControlPlane
from kvstack.lora.upkeep import sync_releases

__all__ = ["create_admin_app"]

Handler = Callable[[Request], Awaitable[JSONResponse]]


def create_admin_app(
    plane: ControlPlane, manager: AdapterCacheManager | None, admin_key: str
) -> Starlette:
    if not admin_key:
        raise ConfigError("the admin API needs an admin key (lora.admin_key)")
    api = _AdminAPI(plane, manager)
    table: list[tuple[str, str, Handler]] = [
        ("GET", "/adapters", api.list_adapters),
        ("POST", "/adapters", api.register),
        ("GET", "/adapters/{adapter_id}", api.show),
        ("POST", "/adapters/{adapter_id}/promote", api.promote),
        ("POST", "/adapters/{adapter_id}/canary", api.canary),
        ("POST", "/adapters/{adapter_id}/rollback", api.rollback),
        ("POST", "/adapters/{adapter_id}/disable", api.disable),
        ("POST", "/adapters/{adapter_id}/prewarm", api.prewarm),
        ("GET", "/engines", api.engines),
        ("GET", "/audit", api.audit),
        ("GET", "/ttft", api.ttft),
    ]
    routes = [Route(path, _guarded(h, admin_key), methods=[m]) for m, path, h in table]
    return Starlette(routes=routes)


def _guarded(handler: Handler, admin_key: str) -> Handler:
    async def guarded(request: Request) -> JSONResponse:
        given = request.headers.get("authorization", "")
        token = given[len("Bearer ") :] if given.startswith("Bearer ") else ""
        if not hmac.compare_digest(token.encode(), admin_key.encode()):
            return _error(401, "unauthorized", "a valid admin key is required (Bearer)")
        try:
            return await handler(request)
        except VerificationError as exc:
            return _error(422, exc.reason, str(exc))
        except RegistryError as exc:
            return _error(404 if "unknown" in str(exc) else 409, "registry", str(exc))
        except (LoRAError, ValueError) as exc:
            return _error(400, "bad_request", str(exc))

    return guarded


class _AdminAPI:
    def __init__(self, plane: ControlPlane, manager: AdapterCacheManager | None) -> None:
        self.plane = plane
        self.manager = manager

    async def list_adapters(self, request: Request) -> JSONResponse:
        tenant = request.query_params.get("tenant")
        versions = await asyncio.to_thread(self.plane.registry.list_adapters, tenant)
        return JSONResponse({"adapters": [_version(v) for v in versions]})

    async def register(self, request: Request) -> JSONResponse:
        body = await _json(request)
        source, adapter_id, version_name = (
            _str(body, f) for f in ("source", "adapter_id", "version")
        )
        base, tenant, tier = (_str(body, f) for f in ("base_model", "tenant_id", "priority_tier"))
        actor = _actor(request)
        version = await asyncio.to_thread(
            lambda: self.plane.register(source, adapter_id, version_name, base, tenant, tier, actor)
        )
        await self._changed()
        return JSONResponse(_version(version), status_code=201)

    async def show(self, request: Request) -> JSONResponse:
        adapter_id = request.path_params["adapter_id"]
        release = await asyncio.to_thread(self.plane.registry.release, adapter_id)
        if release is None:
            raise RegistryError(f"unknown adapter {adapter_id!r}")
        versions = await asyncio.to_thread(self.plane.registry.versions, adapter_id)
        return JSONResponse(
            {"release": _release(release), "versions": [_version(v) for v in versions]}
        )

    async def promote(self, request: Request) -> JSONResponse:
        body = await _json(request)
        version, force = _str(body, "version"), body.get("force") is True
        release = await asyncio.to_thread(
            self.plane.promote, request.path_params["adapter_id"], version, _actor(request), force
        )
        await self._changed()
        return JSONResponse(_release(release))

    async def canary(self, request: Request) -> JSONResponse:
        body = await _json(request)
        adapter_id, version = request.path_params["adapter_id"], _str(body, "version")
        percent = body.get("percent")
        if not isinstance(percent, int | float) or isinstance(percent, bool):
            raise LoRAError("'percent' must be a number 0-100")
        prewarmed = await self._shadow_prewarm(adapter_id, version)
        force = body.get("force") is True
        release = await asyncio.to_thread(
            self.plane.canary, adapter_id, version, float(percent), _actor(request), force
        )
        await self._changed()
        return JSONResponse({**_release(release), "prewarmed": prewarmed})

    async def rollback(self, request: Request) -> JSONResponse:
        release = await asyncio.to_thread(
            self.plane.rollback, request.path_params["adapter_id"], _actor(request)
        )
        await self._changed()
        return JSONResponse(_release(release))

    async def disable(self, request: Request) -> JSONResponse:
        version = _str(await _json(request), "version")
        release = await asyncio.to_thread(
            self.plane.disable, request.path_params["adapter_id"], version, _actor(request)
        )
        await self._changed()
        return JSONResponse(_release(release))

    async def prewarm(self, request: Request) -> JSONResponse:
        body = await _json(request)
        adapter_id = request.path_params["adapter_id"]
        manager = self._manager()
        version = body.get("version") or self._stable(adapter_id)
        adapter = await asyncio.to_thread(self.plane.registry.get, adapter_id, str(version))
        engines = body.get("engines")
        outcome = await manager.prewarm(adapter, engines if isinstance(engines, list) else None)
        return JSONResponse({"adapter": adapter.engine_name, "engines": outcome})

    async def engines(self, request: Request) -> JSONResponse:
        manager = self._manager()
        return JSONResponse(
            {"engines": [asdict(manager.snapshot(u)) for u in sorted(manager.engines)]}
        )

    async def audit(self, request: Request) -> JSONResponse:
        q = request.query_params
        limit = int(q.get("limit", "100"))
        entries = await asyncio.to_thread(
            self.plane.audit.entries, q.get("adapter_id"), q.get("action"), min(limit, 10_000)
        )
        return JSONResponse({"entries": [asdict(e) for e in entries]})

    async def ttft(self, request: Request) -> JSONResponse:
        q = request.query_params
        summary = self._manager().metrics.ttft_summary(q.get("adapter", "*"), q.get("start"))
        return JSONResponse(asdict(summary))

    # -- helpers --------------------------------------------------------------------------

    def _manager(self) -> AdapterCacheManager:
        if self.manager is None:
            raise LoRAError("no adapter cache manager is attached to this admin API")
        return self.manager

    def _stable(self, adapter_id: str) -> str:
        assert self.manager is not None
        release = self.manager.resolver.release(adapter_id)
        if release is None or release.stable_version is None:
            raise RegistryError(f"unknown adapter {adapter_id!r} or no stable version")
        return release.stable_version

    async def _shadow_prewarm(self, adapter_id: str, version: str) -> dict[str, str]:
        """Load a canary on a few engines before it takes traffic."""
        if self.manager is None or self.plane.config.canary_prewarm_engines == 0:
            return {}
        adapter = await asyncio.to_thread(self.plane.registry.get, adapter_id, version)
        engines = [
            u
            for u, e in sorted(self.manager.engines.items())
            if e.spec.base_model == adapter.base_model
        ]
        return await self.manager.prewarm(
            adapter, engines[: self.plane.config.canary_prewarm_engines]
        )

    async def _changed(self) -> None:
        if self.manager is not None:
            await self.manager.resolver.refresh_async()
            sync_releases(self.manager)


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise LoRAError("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise LoRAError("the body must be a JSON object")
    return body


def _str(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise LoRAError(f"{key!r} is required (a non-empty string)")
    return value


def _actor(request: Request) -> str:
    return f"admin-api:{request.headers.get('x-actor', 'unknown')[:64]}"


def _version(v: AdapterVersion) -> dict[str, Any]:
    out = asdict(v)
    out["status"] = v.status.value
    out["engine_name"] = v.engine_name
    return out


def _release(r: Release) -> dict[str, Any]:
    return asdict(r)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)
