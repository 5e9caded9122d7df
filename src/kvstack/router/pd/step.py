"""Prefill/decode disaggregation: a prefill backend computes the prompt's KV, the decode
backend loads it and generates; the client sees one response, from the decode backend.

For a model listed in ``router.pd.models``, the proxy picks the decode backend first (among
``decode`` and ``both`` backends, through the pipeline: the cost model), then asks
:meth:`PrefillStep.run` whether a remote prefill pays: only when the decode backend would
compute at least ``min_remote_prefill_tokens`` prompt tokens itself (its uncached suffix, after
prefix credit) and another backend can prefill. The prefill backend (``prefill`` or ``both``,
again through the pipeline) gets the same body with ``max_tokens`` 1, not streamed; kvstack's
connector there runs as ``kv_producer`` and writes the prompt's chunks to the shared tier before
the step returns. The original request then goes to the decode backend (``kv_consumer``), whose
connector loads those chunks instead of computing them. A failed or slow prefill step costs
only time: the decode backend computes the prompt itself.

A request for a managed LoRA adapter prefills with the adapter the decode backend serves it
with (kvstack's chunk keys include the adapter, so only that KV is of use), on a prefill
backend where the adapter is hot already; where none is, a background load starts on the chosen
one and the decode backend computes the prompt (outcome ``adapter_not_hot``). When the decode
backend falls back to the base model, so does the prefill.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from kvstack.errors import KVStackError, NoBackendError, UpstreamError
from kvstack.lora.decision import Action
from kvstack.metrics import counter, histogram
from kvstack.router.fleet.backends import BackendState, BackendView
from kvstack.router.pd.config import PDConfig
from kvstack.router.request import RoutingRequest, encode_body
from kvstack.router.scheduling.pipeline import Pipeline, RoutingDecision
from kvstack.router.scheduling.plugins.base import RequestObserver
from kvstack.router.upstream.pool import Deadline
from kvstack.router.upstream.relay import Relay

if TYPE_CHECKING:
    from kvstack.lora.decision import Decision as AdapterDecision
    from kvstack.router.adapters import AdapterGate

__all__ = ["PrefillOutcome", "PrefillStep"]

PREFILLS = counter(
    "kvstack_router_pd_prefills_total", "PD requests by prefill outcome", ["outcome"]
)
PREFILL_S = histogram("kvstack_router_pd_prefill_seconds", "Remote prefill step duration")
REMOTE_KEY = "pd_remote_prefill"
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PrefillOutcome:
    outcome: str  # remote | short_suffix | no_prefill_backend | adapter_not_hot | failed:<kind>
    backend: str = ""
    seconds: float = 0.0
    uncached_tokens: int = 0

    def note(self) -> str:
        if self.outcome == "remote":
            return f"pd=remote:{self.backend}({self.seconds * 1000:.0f}ms)"
        return f"pd={self.outcome}(uncached={self.uncached_tokens})"


def decode_candidates(backends: Sequence[BackendView]) -> list[BackendView]:
    return [b for b in backends if b.backend.role in ("decode", "both")]


def prefill_candidates(backends: Sequence[BackendView], exclude: str) -> list[BackendView]:
    return [b for b in backends if b.backend.role in ("prefill", "both") and b.id != exclude]


class PrefillStep:
    def __init__(
        self,
        config: PDConfig,
        pipeline: Pipeline,
        relay: Relay,
        adapters: AdapterGate | None = None,
    ) -> None:
        self.config = config
        self.pipeline = pipeline
        self.relay = relay
        self.adapters = adapters
        self.models = frozenset(config.models)

    def applies(self, request: RoutingRequest) -> bool:
        return request.target in self.models

    async def run(
        self,
        request: RoutingRequest,
        path: str,
        headers: dict[str, str],
        backends: Sequence[BackendView],
        decode: RoutingDecision,
        uncached_tokens: int,
        observers: Sequence[RequestObserver],
        adapter: AdapterDecision | None = None,
    ) -> PrefillOutcome:
        """Prefill remotely if it pays; never raises for a failed prefill. ``adapter`` is the
        decode backend's adapter decision, if the request is for a managed adapter."""
        if uncached_tokens < self.config.min_remote_prefill_tokens:
            return self._count(PrefillOutcome("short_suffix", uncached_tokens=uncached_tokens))
        candidates = prefill_candidates(backends, decode.backend.id)
        try:
            if self.adapters is not None:
                candidates = self.adapters.candidates(request, candidates)
            if not candidates:
                raise NoBackendError("no prefill backend")
            chosen = self.pipeline.decide(request, candidates)
        except NoBackendError:
            return self._count(
                PrefillOutcome("no_prefill_backend", uncached_tokens=uncached_tokens)
            )
        model, hold = request.target, None
        if adapter is not None:
            model = adapter.model
            if adapter.action is Action.SERVE:
                assert self.adapters is not None
                try:
                    hold = self.adapters.hold_for_prefill(request, chosen.backend)
                except KVStackError as exc:  # the request goes on; the prefill step is skipped
                    log.warning("no adapter hold for a prefill on %s: %s", chosen.backend.id, exc)
                    return self._count(
                        PrefillOutcome("failed:adapter", chosen.backend.id, 0.0, uncached_tokens)
                    )
                if hold is None:
                    return self._count(
                        PrefillOutcome("adapter_not_hot", chosen.backend.id, 0.0, uncached_tokens)
                    )
        done = PrefillOutcome("failed:cancelled", chosen.backend.id)
        try:
            done = await self._prefill(
                request, path, headers, chosen, uncached_tokens, observers, model
            )
        finally:
            if hold is not None:  # the adapter's outcome, as a decode attempt reports it
                hold.finish(ok=done.outcome == "remote")
        return self._count(done)

    async def _prefill(
        self,
        request: RoutingRequest,
        path: str,
        headers: dict[str, str],
        chosen: RoutingDecision,
        uncached_tokens: int,
        observers: Sequence[RequestObserver],
        model: str,
    ) -> PrefillOutcome:
        state = cast(BackendState, chosen.backend)
        lease = state.load.acquire(uncached_tokens)
        for observer in observers:
            observer.on_dispatch(request, state)
        start = time.perf_counter()
        outcome = "ok"
        deadline = Deadline(self.config.prefill_timeout_s, "prefill")
        try:
            status, _ = await self.relay.fetch(
                state.url, path, headers, encode_body(prefill_body(request, model)), state.id,
                deadline,
            )  # fmt: skip
            if status != 200:
                outcome = f"failed:status_{status}"
        except UpstreamError as exc:
            outcome = f"failed:{exc.kind}"
        finally:
            deadline.cancel()
            lease.release()
            for observer in observers:
                observer.on_finish(request, state, outcome)
        seconds = time.perf_counter() - start
        if outcome != "ok":
            return PrefillOutcome(outcome, state.id, seconds, uncached_tokens)
        PREFILL_S.observe(seconds)
        request.scratch[REMOTE_KEY] = state.id
        return PrefillOutcome("remote", state.id, seconds, uncached_tokens)

    @staticmethod
    def _count(outcome: PrefillOutcome) -> PrefillOutcome:
        PREFILLS.labels(outcome.outcome.partition(":")[0]).inc()
        return outcome


def prefill_body(request: RoutingRequest, model: str) -> dict[str, Any]:
    """The request as a prefill step: one token, one choice, not streamed, same prompt."""
    drop = ("stream", "stream_options", "n", "best_of")
    out: dict[str, Any] = {k: v for k, v in request.body.items() if k not in drop}
    out["model"] = model
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    return out
