"""Building decisions and finishing requests: the in-flight lease, TTFT per adapter (cold or
warm apart), the wrong-version check, and retiring a superseded version after its last request."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kvstack.lora.adapters import AdapterVersion
from kvstack.lora.config import RequestClassBudget
from kvstack.lora.decision import Action, Decision
from kvstack.lora.loader import EngineState
from kvstack.lora.residency import Entry, Tier
from kvstack.lora.upkeep import retire

if TYPE_CHECKING:
    from kvstack.lora.manager import AdapterCacheManager

__all__ = ["not_now", "serve"]

log = logging.getLogger(__name__)


def serve(
    m: AdapterCacheManager,
    eng: EngineState,
    adapter: AdapterVersion,
    start: Tier,
    waited_s: float,
    predicted_s: float,
) -> Decision:
    entry = eng.cache.entries[adapter.engine_name]
    entry.in_flight += 1
    decision = Decision(
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
    m: AdapterCacheManager,
    eng: EngineState,
    adapter: AdapterVersion,
    start: Tier,
    klass: RequestClassBudget,
    reason: str,
    retry_s: float | None,
) -> Decision:
    allowed = m.config.tenant(adapter.tenant_id).allow_base_fallback
    fallback = klass.on_over_budget == "fallback" and allowed
    action = Action.FALLBACK if fallback else Action.REJECT
    m.metrics.fallback(adapter.adapter_id, action.value, reason, m.is_protected(adapter))
    decision = Decision(
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
    m: AdapterCacheManager,
    eng: EngineState,
    entry: Entry,
    decision: Decision,
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
    m: AdapterCacheManager, adapter: AdapterVersion, decision: Decision, ttft_s: float | None
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
