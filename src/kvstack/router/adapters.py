"""The LoRA stage: adapters through the control plane, the router side of :mod:`kvstack.lora`.

Everything the router does for a managed adapter happens in :class:`AdapterStage`. With
``router.adapters.enabled``, a request for ``model: tenant-a-support`` goes this way:

1. **resolve** (model routing, :meth:`Router.resolve_target`): the registry snapshot maps the
   name to an adapter version (``tenant-a-support@3``, or the canary version for the canary
   share of sessions) with its tenant and priority tier, kept in ``request.state.adapter``.
   The request then targets the adapter's *base model*: every engine serving it is a
   candidate, hot or not. An API key bound to a tenant sees only that tenant's adapters
   (another tenant's name is "unknown", as if it did not exist). A request without a priority
   header gets its tier's priority (``priority_by_tier``).
2. **filter** (the pipeline's first filter): only engines the cache manager drives for that
   base model.
3. **pick**: the ``lora_affinity`` scorer reads the manager's residency — hot, then loading,
   then warm, then the adapter's rendezvous home among cold engines — combined with load or
   the TTFT cost model by the pipeline.
4. **before the attempt** (an attempt step, on the chosen engine): the cache manager makes the
   adapter hot under the request class's cold-start budget (``x-kvstack-request-class``). It
   answers *serve* (the body's ``model`` becomes ``adapter_id@version``), *fallback* (the base
   model, marked in ``x-kvstack-adapter-fallback``) or *reject* (503 with ``Retry-After``).
   For a prefill/decode model, the remote prefill then runs with the same ``model``
   (:meth:`AdapterStage.prefill_model`) on a prefill engine where the adapter is hot already;
   where it is not, a background load starts there and the decode engine computes the prompt
   itself (a prefill never waits for a load).
5. **finish** (an observer, when the attempt ends): the manager learns the outcome, the TTFT
   (cold or warm) and the model the engine answered with (a wrong version is counted as a
   violation), and releases the adapter for eviction. A decision no attempt finished (one
   cancelled before its dispatch) is finished by the request state's ``release``.

Names that are not registered adapters pass through untouched (base models, or adapters an
engine serves by itself).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvstack.errors import KVStackError, NoBackendError, RegistryError, RequestError
from kvstack.lora.decision import Action
from kvstack.router.attempt import Attempt
from kvstack.router.config import AdaptersConfig
from kvstack.router.fleet.backends import BackendView
from kvstack.router.http.responses import ASGIApp
from kvstack.router.pd.plan import PrefillModel
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.plugins.base import Filter, PluginContext

if TYPE_CHECKING:
    from kvstack.lora.control import LoRAControl
    from kvstack.lora.resolver import AdapterResolution

__all__ = ["AdapterStage", "served_model"]

log = logging.getLogger(__name__)
_MODEL_FIELD = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.)*)"')


class AdapterStage(Filter):
    """A filter (step 2), an attempt step (4) and an observer (5) in one; built by the router
    when the adapter control plane is wired in, not by name."""

    name = "adapters"

    def __init__(
        self, control: LoRAControl, config: AdaptersConfig, context: PluginContext | None = None
    ) -> None:
        super().__init__(context or PluginContext())
        self.control = control
        self.config = config

    # -- 1. resolve -----------------------------------------------------------------------
    def resolve(self, request: RoutingRequest) -> RoutingRequest:
        """The request aimed at the adapter's base model, its resolution in its state; the
        request itself when its target is not a registered adapter."""
        resolution = self._resolution(request)
        if resolution is None:
            return request
        priority = request.priority
        if priority is None:
            priority = self.config.priority_by_tier.get(resolution.priority_tier)
        resolved = request.with_target(self.base_model_name(resolution), priority=priority)
        resolved.state.adapter = resolution
        return resolved

    def knows(self, model: str) -> bool:
        """Whether ``model`` names a registered adapter (any version syntax)."""
        name = model.split("@", 1)[0]
        return self.control.resolver.release(name) is not None

    def listed(self, tenant: str | None) -> list[dict[str, Any]]:
        """``/v1/models`` entries of the registry's adapters (the tenant's own, if given)."""
        entries = []
        for adapter in self.control.resolver.current_versions():
            if not self._visible(adapter.tenant_id, tenant):
                continue
            release = self.control.resolver.release(adapter.adapter_id)
            if release is None or release.stable_version != adapter.version:
                continue
            entries.append(
                {
                    "id": adapter.adapter_id,
                    "object": "model",
                    "created": 0,
                    "owned_by": adapter.tenant_id,
                    "parent": adapter.base_model,
                    "version": adapter.version,
                }
            )
        return entries

    def admin_app(self) -> ASGIApp | None:
        """The adapter admin API, when the control plane has an admin key."""
        if self.control.config.admin_key is None:
            return None
        app: ASGIApp = self.control.admin_app()
        return app

    def _resolution(self, request: RoutingRequest) -> AdapterResolution | None:
        routing_key = request.session_id or request.user or request.tenant
        try:
            resolution = self.control.resolver.resolve(request.target, routing_key)
        except RegistryError as exc:
            raise RequestError(str(exc), 404, param="model", code="model_not_found") from None
        if resolution is None:
            return None
        if not self._visible(resolution.tenant_id, request.tenant):
            # Another tenant's adapter: answered exactly like a name that does not exist.
            raise RequestError(
                f"the model {request.target!r} does not exist", 404, "model", "model_not_found"
            )
        return resolution

    def _visible(self, owner: str, tenant: str | None) -> bool:
        """Whether a client of ``tenant`` (None: no API keys) may use an adapter of ``owner``."""
        return not self.config.tenant_isolation or tenant is None or owner == tenant

    def base_model_name(self, resolution: AdapterResolution) -> str:
        """The name engines serve the adapter's base model under."""
        for engine in self.control.manager.engines.values():
            if engine.spec.base_model == resolution.base_model:
                return engine.spec.served_model_name
        raise RequestError(
            f"no engine is configured for base model {resolution.base_model!r} of adapter "
            f"{resolution.engine_name} (lora.engines)",
            503,
            code="no_engine_for_base_model",
        )

    # -- 2. filter ------------------------------------------------------------------------
    def filter(self, request: RoutingRequest, backends: Sequence[BackendView]) -> list[BackendView]:
        resolution = request.state.adapter
        if resolution is None:
            return list(backends)
        engines = {_norm(url): e for url, e in self.control.manager.engines.items()}
        chosen = [
            b
            for b in backends
            if (e := engines.get(_norm(b.url))) is not None
            and e.spec.base_model == resolution.base_model
        ]
        if not chosen:
            raise NoBackendError(
                f"no backend the adapter manager drives serves base model "
                f"{resolution.base_model!r} of {resolution.engine_name}"
            )
        return chosen

    # -- 4. before the attempt ------------------------------------------------------------
    async def before_attempt(self, request: RoutingRequest, attempt: Attempt) -> None:
        """Make the adapter hot on the attempt's backend (budgets apply) and send the model
        the manager decided; raises RequestError 503 (Retry-After when a retry may pass) when
        it cannot be served there now and the tenant takes no fallback."""
        resolution = request.state.adapter
        if resolution is None:
            return
        url = self._engine_url(attempt.backend.url)
        decision = await self.control.manager.ensure_hot(url, resolution, self._class(request))
        if decision.action is Action.REJECT:
            decision.finish(ok=False)
            raise RequestError(
                f"adapter {resolution.engine_name} cannot be served now ({decision.reason})",
                503,
                code="adapter_unavailable",
                retry_after_s=decision.retry_after_s,
            )
        request.state.adapter_decisions[attempt.backend.id] = decision
        attempt.body = request.body_with_model(attempt.body, decision.model)
        for name, value in decision.headers().items():
            attempt.response_headers.append((name.encode(), value.encode("latin-1", "replace")))

    def prefill_model(
        self, request: RoutingRequest, decode_id: str, backend: BackendView
    ) -> PrefillModel:
        """The model a remote prefill on ``backend`` runs with: the one the decode attempt on
        ``decode_id`` was admitted with. A served adapter prefills only where it is hot (held
        until the prefill ends; elsewhere a background load starts and the prefill is
        skipped); see :meth:`kvstack.lora.manager.AdapterCacheManager.hold_for_prefill`."""
        decision = request.state.adapter_decisions.get(decode_id)
        resolution = request.state.adapter
        if decision is None or resolution is None:
            return PrefillModel(request.target)
        if decision.action is not Action.SERVE:
            return PrefillModel(decision.model)  # a fallback prefills with the base model
        try:
            hold = self.control.manager.hold_for_prefill(self._engine_url(backend.url), resolution)
        except KVStackError as exc:  # the request goes on; the prefill step is skipped
            log.warning("no adapter hold for a prefill on %s: %s", backend.id, exc)
            return PrefillModel(decision.model, "failed:adapter")
        if hold is None:
            return PrefillModel(decision.model, "adapter_not_hot")
        request.state.adapter_decisions[backend.id] = hold
        return PrefillModel(decision.model)

    def _class(self, request: RoutingRequest) -> str:
        """The request class (its cold-start budget); RequestError when it is not configured."""
        header = self.config.request_class_header
        klass = request.headers.get(header) or self.config.default_request_class
        if klass not in self.control.config.request_classes:
            known = ", ".join(sorted(self.control.config.request_classes))
            raise RequestError(
                f"{header} {klass!r} is not one of {known}",
                param=header,
                code="invalid_request_class",
            )
        return klass

    def _engine_url(self, backend_url: str) -> str:
        for url in self.control.manager.engines:
            if _norm(url) == _norm(backend_url):
                return url
        raise NoBackendError(f"the adapter manager does not drive backend {backend_url}")

    # -- 5. finish (RequestObserver) ------------------------------------------------------
    def on_dispatch(self, request: RoutingRequest, backend: BackendView) -> None:
        return None

    def on_first_token(self, request: RoutingRequest, backend: BackendView, ttft_s: float) -> None:
        return None

    def on_finish(self, request: RoutingRequest, backend: BackendView, outcome: str) -> None:
        """Finish the manager's decision for ``backend``: outcome, TTFT and the served model."""
        decision = request.state.adapter_decisions.pop(backend.id, None)
        if decision is None:
            return
        answer = request.state.answer
        served = None
        if answer is not None and answer.backend_id == backend.id:
            served = served_model(answer.first_bytes)
        ttft_s = answer.ttft_s if answer is not None and served and request.stream else None
        decision.finish(ttft_s, outcome == "ok", served)


def served_model(first_bytes: bytes) -> str | None:
    """The ``model`` field of an engine's answer, from its first body bytes (JSON or SSE)."""
    match = _MODEL_FIELD.search(first_bytes, 0, 4096)
    return match.group(1).decode("utf-8", "replace") if match else None


def _norm(url: str) -> str:
    return url.rstrip("/")
