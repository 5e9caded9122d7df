"""``Router``: the router's parts wired together, with one start and one close.

Start order: the control-plane client; discovery (its first snapshot fills the pool); one
round of health checks and model reads (so the first request sees live backends); the
scraper; the services and plugins' own background work. Close runs in reverse. The router also
answers what is not per request: a client's model name resolved to a target
(``resolve_target``), ``/v1/models`` and ``/health``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvstack.errors import UnknownModelError
from kvstack.router.adapters import AdapterStage
from kvstack.router.admission.base import ADMISSIONS, Admission
from kvstack.router.attempt import AttemptStep
from kvstack.router.config import RouterConfig
from kvstack.router.fleet.backends import Backend, BackendPool, BackendState
from kvstack.router.fleet.discovery import Discovery, make_discovery
from kvstack.router.fleet.health import HealthChecker
from kvstack.router.fleet.scraper import MetricsScraper
from kvstack.router.http.auth import ApiKeys
from kvstack.router.http.responses import ASGIApp
from kvstack.router.pd.step import PrefillStep
from kvstack.router.proxy import Proxy
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.model_routes import ModelRouter
from kvstack.router.scheduling.pipeline import Pipeline, build_plugin, preset
from kvstack.router.scheduling.plugins.base import Plugin, PluginContext
from kvstack.router.scheduling.scheduler import RoutingScheduler
from kvstack.router.scheduling.services import prefix_state
from kvstack.router.scheduling.unserved import UnservedTargets
from kvstack.router.telemetry import Telemetry
from kvstack.router.tenancy import Tenancy
from kvstack.router.upstream.control import ControlClient
from kvstack.router.upstream.pool import UpstreamPool
from kvstack.router.upstream.relay import Relay

if TYPE_CHECKING:
    from kvstack.lora.control import LoRAControl

__all__ = ["Router"]

log = logging.getLogger(__name__)


class Router:
    """``lora``: the adapter control plane, when ``config.adapters.enabled`` (the CLI builds it
    from the ``lora`` section of the same file; without it, one is built from the environment's
    config). ``tenancy``: cache salts, priority caps and privilege (:mod:`kvstack.router.tenancy`);
    without it, one keyed by the environment's ``security`` section."""

    def __init__(
        self,
        config: RouterConfig,
        discovery: Discovery | None = None,
        lora: LoRAControl | None = None,
        tenancy: Tenancy | None = None,
    ) -> None:
        self.config = config
        rng = random.Random(config.seed)
        self.pool = BackendPool(stale_after_s=config.scrape.stale_after_s)
        self.discovery = discovery or make_discovery(config)
        # control plane: health, models, metrics (with the engines' key: vLLM guards /v1/*)
        self.client = ControlClient(config.auth.upstream_api_key)
        self.upstreams = UpstreamPool(config.timeouts.connect_s)  # the proxied requests
        self.auth = ApiKeys(config.auth)
        self.telemetry = Telemetry()
        self.context = PluginContext(rng=rng, config=config, pool=self.pool)
        self.lora = lora
        if config.adapters.enabled and lora is None:
            from kvstack.lora.control import LoRAControl

            self.lora = LoRAControl.from_config(engine_api_key=config.auth.upstream_api_key)
        self.adapters = self._adapter_stage()
        self.tenancy = tenancy or Tenancy.from_environment(config, self._lora_admin_keys())
        self.pipeline = self._pipeline()
        self.admission: Admission = build_plugin(
            ADMISSIONS.get(config.admission.name), config.admission, self.context
        )
        if config.prefix.share_url:  # replicas share their soft state (router.prefix.replicas)
            from kvstack.router.prefix.replicas import ReplicaSync

            prefix = prefix_state(self.context)
            self.context.services["replicas"] = ReplicaSync(config.prefix, prefix, self.pool)
        # Services the plugins created (prefix state, cost model): shared, started first.
        self.services: list[Any] = list(self.context.services.values())
        registered = None if self.adapters is None else self.adapters.knows
        self.models = ModelRouter(config.models, config.model_aliases, rng, registered)
        self.unserved = UnservedTargets(self.models)
        self.health = HealthChecker(
            self.pool,
            self.client,
            config.health,
            on_round=self.auth.reload_if_changed,
            after_round=self._check_targets,
        )
        self.scraper = MetricsScraper(self.pool, self.client, config.scrape)
        self.scheduler = RoutingScheduler(
            self.pool, self.pipeline, self.admission, self.services, config.pd.models
        )
        relay = Relay(
            self.upstreams, config.timeouts.first_byte_s, frozenset(config.retry.on_status)
        )
        self.proxy = Proxy(config, self.scheduler, relay, self.telemetry, self._steps(relay), rng)
        self.admin_app: ASGIApp | None = (
            None if self.adapters is None else self.adapters.admin_app()
        )
        self._started = False

    def _lora_admin_keys(self) -> list[str]:
        key = None if self.lora is None else self.lora.config.admin_key
        return [] if key is None else [key.get_secret_value()]

    def _adapter_stage(self) -> AdapterStage | None:
        if self.lora is None:
            return None
        self.context.services["lora"] = self.lora  # started and closed with the services
        return AdapterStage(self.lora, self.config.adapters, self.context)

    def _pipeline(self) -> Pipeline:
        """The configured pipeline; the adapter stage filters first when it is wired in."""
        pipeline = Pipeline.from_config(
            self.config.pipeline or preset(self.config.policy), self.context
        )
        if self.adapters is not None:
            pipeline.filters.insert(0, self.adapters)
        return pipeline

    def _steps(self, relay: Relay) -> list[AttemptStep]:
        """What runs before each attempt: the adapter load, then the remote prefill."""
        steps: list[AttemptStep] = [] if self.adapters is None else [self.adapters]
        if self.config.pd.models:
            steps.append(PrefillStep(self.config.pd, self.scheduler, relay, self.adapters))
        return steps

    async def start(self) -> None:
        await self.client.start()
        await self.discovery.start(self._publish)
        await self.health.start()
        self._check_targets()  # after the first model reads: warn about unserved targets
        await self.scraper.start()
        for service in self.services:
            if hasattr(service, "start"):
                await service.start()
        for plugin in self.plugins():
            await plugin.start()
        self._started = True

    def summary(self) -> str:
        """One line for the log once the listener is bound: backends and policy."""
        policy = "custom pipeline" if self.config.pipeline else self.config.policy
        return f"{len(self.pool)} backends ({len(self.pool.usable())} usable), policy {policy}"

    async def close(self) -> None:
        for plugin in reversed(self.plugins()):
            await plugin.close()
        for service in reversed(self.services):
            if hasattr(service, "close"):
                await service.close()
        await self.scraper.close()
        await self.health.close()
        await self.discovery.close()
        await self.client.close()
        self.upstreams.close()
        self._started = False

    def plugins(self) -> list[Plugin]:
        return [self.admission, *self.pipeline.plugins()]

    def _check_targets(self) -> None:
        self.unserved.check(self.pool.states())

    def _publish(self, backends: Sequence[Backend]) -> None:
        self.pool.apply(backends)

    def resolve_target(self, request: RoutingRequest, body: bytes) -> tuple[RoutingRequest, bytes]:
        """The request aimed at what the backends must serve, and the body to send: model
        routes first (aliases, weighted targets), then the adapter registry."""
        try:
            route = self.models.resolve(request.model, self.pool.states(), request.session_id)
        except UnknownModelError:
            if self.adapters is None or not self.adapters.knows(request.model):
                raise
            return self.adapters.resolve(request), body  # registered, no engine has it loaded
        if route.target != request.model:
            request = request.with_target(route.target)
            body = request.body_with_model(body, route.target)
        if self.adapters is not None:
            request = self.adapters.resolve(request)
        return request, body

    def health_report(self) -> tuple[bool, dict[str, Any]]:
        """(any backend reachable, a JSON-able report per backend) for ``/health``."""
        now_s = time.monotonic()
        backends = {s.id: _backend_report(s, now_s) for s in self.pool.states()}
        usable = sum(1 for b in backends.values() if b["usable"])
        return usable > 0, {
            "status": "ok" if usable else "unavailable",
            "usable": usable,
            "total": len(backends),
            "backends": backends,
        }

    def models_payload(self, tenant: str | None = None) -> dict[str, Any]:
        """``/v1/models``: the union of the backends' lists, then the routes and aliases that
        can be served now (judged on the backends' latest lists, so a route appears once a
        backend reports one of its targets), then the registry's adapters. A caller with a
        tenant sees only that tenant's adapters: the adapters the engines list (other tenants'
        among them) are left out of its list, and the registry contributes the tenant's own."""
        seen: dict[str, dict[str, Any]] = {}
        hide_adapters = tenant is not None and self.config.adapters.tenant_isolation
        for state in self.pool.states():
            for entry in state.model_entries or [_plain(m) for m in sorted(state.models)]:
                if hide_adapters and (entry.get("parent") or entry.get("id") in state.adapters):
                    continue
                seen.setdefault(str(entry.get("id")), entry)
        for entry in self.models.listed(self.pool.states()):
            seen.setdefault(entry["id"], entry)
        if self.adapters is not None:
            for entry in self.adapters.listed(tenant):
                seen[entry["id"]] = entry
        return {"object": "list", "data": list(seen.values())}


def _backend_report(state: BackendState, now_s: float) -> dict[str, Any]:
    return {
        "url": state.url,
        "usable": state.reachable,
        "healthy": state.healthy,
        "ejected": state.ejection.is_ejected(now_s),
        "in_flight": state.in_flight,
        "last_error": state.last_error or None,
    }


def _plain(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "kvstack"}
