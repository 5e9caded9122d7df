"""Building decisions and finishing requests: the in-flight lease, TTFT per adapter (cold or
warm apart), the wrong-version check, and retiring a superseded version after its last request.

The helpers take the manager as a :class:`ServingContext`, the few parts of it they use, so that
this module sits below :mod:`kvstack.lora.manager` (which calls it) and
:mod:`kvstack.lora.upkeep` (which retires versions in its sweeps) and imports neither.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from kvstack.lora.adapters import AdapterVersion, Status
from kvstack.lora.config import LoRAConfig, RequestClassBudget
from kvstack.lora.decision import Action, AdapterDecision
from kvstack.lora.loader import AdapterLoader, EngineState
from kvstack.lora.metrics import LoRAMetrics
from kvstack.lora.residency import Entry, ResidencyTier, State
from kvstack.lora.resolver import Resolver

__all__ = ["ServingContext", "not_now", "retire", "serve"]

log = logging.getLogger(__name__)


class ServingContext(Protocol):
    """What serving and retiring need of the adapter cache manager (which is one)."""

    @property
    def config(self) -> LoRAConfig: ...

    @property
    def metrics(self) -> LoRAMetrics: ...

    @property
    def resolver(self) -> Resolver: ...

    @property
    def loader(self) -> AdapterLoader: ...

    def clock(self) -> float:
        """Now, in the manager's seconds."""
        ...

    def is_protected(self, adapter: AdapterVersion) -> bool:
        """Canary and pinned adapters are always named in metrics."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background; the manager cancels it when it closes."""
        ...


def serve(
    m: ServingContext,
    eng: EngineState,
    adapter: AdapterVersion,
    start: ResidencyTier,
    waited_s: float,
    predicted_s: float,
) -> AdapterDecision:
    entry = eng.cache.entries[adapter.engine_name]
    entry.in_flight += 1
    decision = AdapterDecision(
        Action.SERVE,
        adapter.engine_name,
        eng.spec.url,
        adapter.engine_name,
        start.value,
        waited_s=waited_s,
        predicted_load_s=predicted_s,
    )
    decision._finish = lambda ttft, ok, served: _finish(m, eng, entry, decision, ttft, ok, served)
    return decision


def not_now(
    m: ServingContext,
    eng: EngineState,
    adapter: AdapterVersion,
    start: ResidencyTier,
    klass: RequestClassBudget,
    reason: str,
    retry_s: float | None,
) -> AdapterDecision:
    allowed = m.config.tenant(adapter.tenant_id).allow_base_fallback
    fallback = klass.on_over_budget == "fallback" and allowed
    action = Action.FALLBACK if fallback else Action.REJECT
    m.metrics.fallback(adapter.adapter_id, action.value, reason, m.is_protected(adapter))
    decision = AdapterDecision(
        action,
        eng.spec.served_model_name if fallback else "",
        eng.spec.url,
        adapter.engine_name,
        start.value,
        reason=reason,
        predicted_load_s=retry_s or 0.0,
        retry_after_s=None if fallback else retry_s,
    )
    decision._finish = lambda ttft, ok, served: _finish_fallback(m, adapter, decision, ttft)
    return decision


def _finish(
    m: ServingContext,
    eng: EngineState,
    entry: Entry,
    decision: AdapterDecision,
    ttft_s: float | None,
    ok: bool,
    served: str | None,
) -> None:
    entry.in_flight -= 1
    if entry.in_flight == 0:
        eng.notify_released()
    adapter = entry.adapter
    eng.stats.get(entry.name).on_result(ok)
    if served is not None and served != decision.model:
        m.metrics.violation("wrong_version")
        log.error("request routed to %s was answered by %s", decision.model, served)
    if ttft_s is not None:
        m.metrics.ttft(
            adapter.adapter_id,
            adapter.tenant_id,
            adapter.version,
            decision.start,
            ttft_s,
            m.is_protected(adapter),
        )
    if entry.in_flight == 0 and not m.resolver.is_current(adapter.adapter_id, adapter.version):
        m.spawn(retire(m, eng, entry))


def _finish_fallback(
    m: ServingContext, adapter: AdapterVersion, decision: AdapterDecision, ttft_s: float | None
) -> None:
    if ttft_s is not None and decision.action is Action.FALLBACK:
        m.metrics.ttft(
            adapter.adapter_id,
            adapter.tenant_id,
            adapter.version,
            "fallback",
            ttft_s,
            m.is_protected(adapter),
        )


async def retire(m: ServingContext, eng: EngineState, entry: Entry) -> None:
    """Unload a superseded version once unused; drop a disabled one's files as well."""
    adapter = entry.adapter
    if m.resolver.is_current(adapter.adapter_id, adapter.version):
        return
    if eng.cache.entries.get(entry.name) is not entry or eng.cache.is_protected(entry, m.clock()):
        return
    known = m.resolver.version(adapter.adapter_id, adapter.version)
    if known is None or known.status is Status.DISABLED:
        eng.cache.drop(entry.name)
        await m.loader.drop(eng, entry, "disabled", pinned=False)
    elif entry.state is State.HOT:
        eng.cache.set_state(entry.name, State.WARM)
        await m.loader.demote(eng, entry.name, "superseded")
