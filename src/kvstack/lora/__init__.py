"""The LoRA adapter control plane: registry, artifact store, verification, adapter cache.

What the router calls (everything it needs, nothing more)::

    from kvstack.lora import LoRAControl, Action

    lora = LoRAControl.from_config(config.lora)     # registry, store, verifier, manager
    await lora.start()                              # registry refresh, reconciliation, sweeps
    app.mount("/admin/lora", lora.admin_app())      # admin API, bearer admin key

    # per request
    resolution = lora.resolver.resolve(body["model"], routing_key=user_or_session)
    if resolution is None: ...                      # not an adapter: a base model or unknown
    # LoRA affinity scorer: prefer hot, then warm, then a free slot
    tier = lora.manager.residency(engine_url, resolution.engine_name)   # a ResidencyTier
    free = lora.manager.free_hot_slots(engine_url)
    # once an engine is picked
    decision = await lora.manager.ensure_hot(engine_url, resolution, request_class="interactive")
    if decision.action is Action.REJECT:            # 503, decision.headers() has Retry-After
        ...
    body["model"] = decision.model                  # adapter_id@version, or the base model
    response_headers.update(decision.headers())     # fallback marker when on the base model
    ...
    decision.finish(ttft_s=ttft, ok=status_ok, served_model=answer["model"])

- :class:`Resolver` maps a client model name to an adapter version (stable, or canary for
  ``canary_percent`` % of routing keys), its tenant and priority tier; ``name@version`` pins.
- :class:`AdapterCacheManager` keeps per-engine residency (hot / warm / cold), decides under
  the request class's cold-start budget (serve, fall back to base, reject with Retry-After),
  loads single-flight per (engine, adapter) through the engine's runtime LoRA endpoints, and
  evicts by weighted hotness (or LRU); :meth:`~AdapterCacheManager.snapshot` lists an engine's
  hot and warm adapters and free slots.
- :class:`ControlPlane` registers (verified, content-addressed), signs, verifies, promotes,
  canaries, rolls back and disables adapter versions; every decision goes to the audit log.
- :func:`create_admin_app` is the admin HTTP API over both.

Attributes are imported lazily, so ``import kvstack.lora`` is cheap. The names this package
exported before class names became unique across kvstack (``Decision``, ``Resolution``,
``Tier``) still resolve, with a :class:`DeprecationWarning`, to :class:`AdapterDecision`,
:class:`AdapterResolution` and :class:`ResidencyTier`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvstack.lora.adapters import AdapterVersion, Release, Status
    from kvstack.lora.admin import create_admin_app
    from kvstack.lora.config import LoRAConfig
    from kvstack.lora.control import LoRAControl
    from kvstack.lora.decision import FALLBACK_HEADER, Action, AdapterDecision
    from kvstack.lora.manager import AdapterCacheManager, EngineResidency
    from kvstack.lora.plane import ControlPlane
    from kvstack.lora.residency import ResidencyTier
    from kvstack.lora.resolver import AdapterResolution, Resolver

__all__ = [
    "FALLBACK_HEADER",
    "Action",
    "AdapterCacheManager",
    "AdapterDecision",
    "AdapterResolution",
    "AdapterVersion",
    "ControlPlane",
    "EngineResidency",
    "LoRAConfig",
    "LoRAControl",
    "Release",
    "ResidencyTier",
    "Resolver",
    "Status",
    "create_admin_app",
]

_LAZY = {
    "AdapterVersion": "kvstack.lora.adapters",
    "Release": "kvstack.lora.adapters",
    "Status": "kvstack.lora.adapters",
    "create_admin_app": "kvstack.lora.admin",
    "LoRAConfig": "kvstack.lora.config",
    "LoRAControl": "kvstack.lora.control",
    "FALLBACK_HEADER": "kvstack.lora.decision",
    "Action": "kvstack.lora.decision",
    "AdapterDecision": "kvstack.lora.decision",
    "AdapterCacheManager": "kvstack.lora.manager",
    "EngineResidency": "kvstack.lora.manager",
    "ControlPlane": "kvstack.lora.plane",
    "ResidencyTier": "kvstack.lora.residency",
    "AdapterResolution": "kvstack.lora.resolver",
    "Resolver": "kvstack.lora.resolver",
}
# Names this package exported before class names became unique across kvstack.
_DEPRECATED = {
    "Decision": "AdapterDecision",
    "Resolution": "AdapterResolution",
    "Tier": "ResidencyTier",
}


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        import warnings

        new = _DEPRECATED[name]
        warnings.warn(
            f"kvstack.lora.{name} is deprecated; use kvstack.lora.{new}",
            DeprecationWarning,
            stacklevel=2,
        )
        name = new
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kvstack.lora' has no attribute {name!r}")
