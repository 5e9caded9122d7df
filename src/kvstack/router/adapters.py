"""LoRA adapters through the control plane: the router side of :mod:`kvstack.lora`.

With ``router.adapters.enabled``, a request for ``model: tenant-a-support`` goes this way:

1. **resolve** (at parse): the registry snapshot maps the name to an adapter version
   (``tenant-a-support@3``, or the canary version for the canary share of sessions) with its
   tenant and priority tier. The request then targets the adapter's *base model*: every engine
   serving it is a candidate, hot or not. An API key bound to a tenant sees only that
   tenant's adapters (another tenant's name is "unknown", as if it did not exist). A request
   without a priority header gets its tier's priority (``priority_by_tier``).
2. **candidates**: only engines the cache manager drives for that base model.
3. **pick**: the ``lora_affinity`` scorer reads the manager's residency — hot, then loading,
   then warm, then the adapter's rendezvous home among cold engines — combined with load or
   the TTFT cost model by the pipeline.
4. **admit** (per attempt, on the chosen engine): the cache manager makes the adapter hot under
   the request class's cold-start budget (``x-kvstack-request-class``). It answers *serve*
   (the body's ``model`` becomes ``adapter_id@version``), *fallback* (the base model, marked
   in ``x-kvstack-adapter-fallback``) or *reject* (503 with ``Retry-After``).
   For a prefill/decode model, the remote prefill step then runs with the same ``model`` on a
   prefill engine where the adapter is hot already; where it is not, a background load starts
   there and the decode engine computes the prompt itself (a prefill never waits for a load).
5. **finish**: when the attempt ends, the manager learns the outcome, the TTFT (cold or warm)
   and the model the engine answered with (a wrong version is counted as a violation), and
   releases the adapter for eviction.

Names that are not registered adapters pass through untouched (base models, or adapters an
engine serves by itself).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvstack.errors import NoBackendError, RegistryError, RequestError
from kvstack.router.config import AdaptersConfig
from kvstack.router.fleet.backends import BackendView
from kvstack.router.request import RoutingRequest, encode_body

if TYPE_CHECKING:
    from kvstack.lora.control import LoRAControl
    from kvstack.lora.decision import Decision
    from kvstack.lora.resolver import Resolution

__all__ = ["ADAPTER_KEY", "AdapterGate", "served_model"]

ADAPTER_KEY = "lora"  # RoutingRequest.scratch: the request's Resolution
_MODEL_FIELD = re.compile(rb'"model"\s*:\s*"((?:[^"\\]|\\.)*)"')


class AdapterGate:
    def __init__(self, control: LoRAControl, config: AdaptersConfig) -> None:
        self.control = control
        self.config = config

    # -- 1. resolve -----------------------------------------------------------------------

    def resolve(self, request: RoutingRequest, body: bytes) -> tuple[RoutingRequest, bytes]:
        """The request aimed at the adapter's base model, its resolution in the scratch."""
        resolution = self._resolution(request)
        if resolution is None:
            return request, body
        base = self.base_model_name(resolution)
        priority = request.priority
        if priority is None:
            priority = self.config.priority_by_tier.get(resolution.priority_tier)
        resolved = dataclasses.replace(request.with_target(base), priority=priority)
        resolved.scratch[ADAPTER_KEY] = resolution
        return resolved, body

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

    def _resolution(self, request: RoutingRequest) -> Resolution | None:
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

    def base_model_name(self, resolution: Resolution) -> str:
        """The name engines serve the adapter's base model under."""
        for engine in self.control.manager.engines.values():
            if engine.spec.base_model == resolution.base_model:
                return engine.spec.served_model_name
        raise RequestError(
            f"no engine is configured for base model {resolution.base_model!r} of adapter "
            f"{resolution.engine_name} (lora.engines)",
            503,
            code="no_engine_for_base_model",
            kind="service_unavailable",
        )

    # -- 2. candidates --------------------------------------------------------------------

    def candidates(
        self, request: RoutingRequest, everyone: Sequence[BackendView]
    ) -> list[BackendView]:
        resolution: Resolution | None = request.scratch.get(ADAPTER_KEY)
        if resolution is None:
            return list(everyone)
        engines = {_norm(url): e for url, e in self.control.manager.engines.items()}
        chosen = [
            b
            for b in everyone
            if (e := engines.get(_norm(b.url))) is not None
            and e.spec.base_model == resolution.base_model
        ]
        if not chosen:
            raise NoBackendError(
                f"no backend the adapter manager drives serves base model "
                f"{resolution.base_model!r} of {resolution.engine_name}"
            )
        return chosen

    # -- 4. admit -------------------------------------------------------------------------

    async def admit(
        self, request: RoutingRequest, backend: BackendView, body: bytes
    ) -> tuple[Decision | None, bytes, list[tuple[bytes, bytes]]]:
        """(the manager's decision, the body to send, response headers to add); raises
        RequestError 503 (Retry-After when a retry may pass) when the adapter cannot be served
        there now and the tenant takes no fallback."""
        resolution: Resolution | None = request.scratch.get(ADAPTER_KEY)
        if resolution is None:
            return None, body, []
        from kvstack.lora.decision import Action

        klass = request.headers.get(self.config.request_class_header)
        klass = klass or self.config.default_request_class
        if klass not in self.control.config.request_classes:
            known = ", ".join(sorted(self.control.config.request_classes))
            raise RequestError(
                f"{self.config.request_class_header} {klass!r} is not one of {known}",
                param=self.config.request_class_header,
                code="invalid_request_class",
            )
        url = self._engine_url(backend.url)
        decision = await self.control.manager.ensure_hot(url, resolution, klass)
        extra = decision.headers().items()
        headers = [(k.encode(), v.encode("latin-1", "replace")) for k, v in extra]
        if decision.action is Action.REJECT:
            decision.finish(ok=False)
            raise RequestError(
                f"adapter {resolution.engine_name} cannot be served now ({decision.reason})",
                503,
                code="adapter_unavailable",
                kind="service_unavailable",
                retry_after_s=decision.retry_after_s,
            )
        rewritten = encode_body({**request.body, "model": decision.model})
        return decision, rewritten, headers

    def hold_for_prefill(self, request: RoutingRequest, backend: BackendView) -> Decision | None:
        """A hold on the request's adapter for a remote prefill step on ``backend`` when it is
        hot there, else None (a background load starts there); see
        :meth:`kvstack.lora.manager.AdapterCacheManager.hold_for_prefill`."""
        resolution: Resolution = request.scratch[ADAPTER_KEY]
        url = self._engine_url(backend.url)
        return self.control.manager.hold_for_prefill(url, resolution)

    def _engine_url(self, backend_url: str) -> str:
        for url in self.control.manager.engines:
            if _norm(url) == _norm(backend_url):
                return url
        raise NoBackendError(f"the adapter manager does not drive backend {backend_url}")


def served_model(first_bytes: bytes) -> str | None:
    """The ``model`` field of an engine's answer, from its first body bytes (JSON or SSE)."""
    match = _MODEL_FIELD.search(first_bytes, 0, 4096)
    return match.group(1).decode("utf-8", "replace") if match else None


def _norm(url: str) -> str:
    return url.rstrip("/")
