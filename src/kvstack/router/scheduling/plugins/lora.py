"""``lora_affinity`` scorer: send an adapter's requests where the adapter is already active.

Per backend, for a request whose target is a LoRA adapter: active there (the engine runs or
queues requests with it, or this router has some in flight there) 1.0 > a free adapter slot
(the batch may take one more adapter without evicting) ``free_slot`` > must evict
``evict``. The engine side comes from ``vllm:lora_requests_info`` (running and waiting
adapters, ``max_lora``); the router side from its own in-flight requests, which see a burst
before any scrape does. When the LoRA control plane is wired in as the ``lora`` service
(``kvstack.lora``: ``manager.residency(url, adapter)``, ``manager.free_hot_slots(url)``), its
residency is used too: hot counts as active, warm (host memory) scores ``warm``.
Requests the control plane resolved (:mod:`kvstack.router.adapters`; they target the base
model) are scored by the manager alone: hot > loading > warm > the adapter's rendezvous home
among cold engines (:func:`kvstack.lora.affinity.affinity_scores`).
Base-model requests score 1.0 everywhere (no preference).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from kvstack.router.fleet.backends import BackendView
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.plugins.base import PluginContext, Scorer, ScoreResult

__all__ = ["LoRAAffinityScorer"]


class LoRAAffinityScorer(Scorer):
    name = "lora_affinity"

    def __init__(
        self, context: PluginContext, free_slot: float = 0.7, warm: float = 0.8, evict: float = 0.2
    ) -> None:
        super().__init__(context)
        for label, value in (("free_slot", free_slot), ("warm", warm), ("evict", evict)):
            if not 0 <= value <= 1:
                raise ValueError(f"{label} must be in [0, 1], got {value}")
        self.free_slot, self.warm, self.evict = free_slot, warm, evict
        self._in_flight: Counter[tuple[str, str]] = Counter()

    def score(self, request: RoutingRequest, backends: Sequence[BackendView]) -> ScoreResult:
        resolution = request.state.adapter
        if resolution is not None:
            return self._managed(resolution.engine_name, backends)
        adapter = request.target
        if not any(adapter in b.adapters for b in backends):
            return ScoreResult(dict.fromkeys((b.id for b in backends), 1.0), "base_model")
        scores = {b.id: self._affinity(adapter, b) for b in backends}
        return ScoreResult(scores, details={i: f"{s:.1f}" for i, s in scores.items()})

    def _managed(self, adapter: str, backends: Sequence[BackendView]) -> ScoreResult:
        lora: Any = self.context.services["lora"]
        by_url = lora.manager.affinity(adapter, [b.url.rstrip("/") for b in backends])
        scores = {b.id: by_url.get(b.url.rstrip("/"), 0.0) for b in backends}
        return ScoreResult(scores, details={i: f"{s:.2f}" for i, s in scores.items()})

    def _affinity(self, adapter: str, backend: BackendView) -> float:
        mine = {a for (b, a), n in self._in_flight.items() if b == backend.id and n > 0}
        engine = backend.engine
        running = set(engine.running_adapters) if engine is not None else set()
        waiting = set(engine.waiting_adapters) if engine is not None else set()
        residency = self._residency(backend, adapter)
        if adapter in mine or adapter in running or adapter in waiting or residency == "hot":
            return 1.0
        if residency == "warm":
            return self.warm
        max_loras = engine.max_loras if engine is not None else None
        if max_loras is None or len(running | waiting | mine) < max_loras:
            return self.free_slot
        return self.evict

    def _residency(self, backend: BackendView, adapter: str) -> str | None:
        """``hot`` / ``warm`` / ``cold`` from the LoRA control plane, when it is wired in."""
        lora: Any = self.context.services.get("lora")
        if lora is None:
            return None
        tier = lora.manager.residency(backend.url, adapter)
        return str(getattr(tier, "value", tier)).lower()

    # -- RequestObserver -------------------------------------------------------------------
    def on_dispatch(self, request: RoutingRequest, backend: BackendView) -> None:
        if request.target in backend.adapters:
            self._in_flight[(backend.id, request.target)] += 1

    def on_first_token(self, request: RoutingRequest, backend: BackendView, ttft_s: float) -> None:
        return None

    def on_finish(self, request: RoutingRequest, backend: BackendView, outcome: str) -> None:
        key = (backend.id, request.target)
        if key in self._in_flight:
            self._in_flight[key] -= 1
            if self._in_flight[key] <= 0:
                del self._in_flight[key]
