"""Prefill/decode disaggregation: a prefill backend computes the prompt's KV, the decode
backend loads it and generates; the client sees one response, from the decode backend.

For a model listed in ``router.pd.models``, the scheduler picks the decode backend first
(among ``decode`` and ``both`` backends, through the pipeline: the cost model). Then, before
the first attempt, :class:`PrefillStep` (an attempt step) asks whether a remote prefill pays:
only when the decode backend would compute at least ``min_remote_prefill_tokens`` prompt
tokens itself (its uncached suffix, after prefix credit) and another backend can prefill. The
prefill backend (``prefill`` or ``both``, again through the pipeline) gets the same body with
``max_tokens`` 1, not streamed; kvstack's connector there runs as ``kv_producer`` and writes
the prompt's chunks to the shared tier before the step returns. The original request then
goes to the decode backend (``kv_consumer``), whose connector loads those chunks instead of
computing them. A failed or slow prefill step costs only time: the decode backend computes the
prompt itself. The outcome goes into the decision header and the request's state.

A request for a managed LoRA adapter prefills with the model the adapter stage says
(:meth:`kvstack.router.adapters.AdapterStage.prefill_model`): the adapter the decode backend
serves it with (kvstack's chunk keys include the adapter, so only that KV is of use), on a
prefill backend where it is hot already (else ``adapter_not_hot``: no prefill, a background
load there), or the base model when the decode backend fell back to it.
"""

from __future__ import annotations

import time
from typing import Any

from kvstack.errors import NoBackendError, UpstreamError
from kvstack.metrics import counter, histogram
from kvstack.router.adapters import AdapterStage
from kvstack.router.attempt import Attempt
from kvstack.router.fleet.backends import BackendState
from kvstack.router.pd.config import PDConfig
from kvstack.router.pd.plan import PREFILL_ROLES, PrefillModel, PrefillOutcome
from kvstack.router.request import RoutingRequest, encode_body
from kvstack.router.scheduling.pipeline import RoutingDecision
from kvstack.router.scheduling.scheduler import RoutingScheduler
from kvstack.router.upstream.pool import Deadline
from kvstack.router.upstream.relay import Relay

PD_ENDPOINTS = frozenset({"completions", "chat"})

__all__ = ["PrefillStep", "prefill_body"]

PREFILLS = counter(
    "kvstack_router_pd_prefills_total", "PD requests by prefill outcome", ["outcome"]
)
PREFILL_S = histogram("kvstack_router_pd_prefill_seconds", "Remote prefill step duration")


class PrefillStep:
    """The attempt step of prefill/decode models (the first attempt only)."""

    def __init__(
        self,
        config: PDConfig,
        scheduler: RoutingScheduler,
        relay: Relay,
        adapters: AdapterStage | None = None,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.relay = relay
        self.adapters = adapters
        self.models = frozenset(config.models)

    async def before_attempt(self, request: RoutingRequest, attempt: Attempt) -> None:
        """Prefill remotely if it pays; never raises for a failed prefill."""
        if attempt.number > 1 or request.target not in self.models:
            return
        if request.endpoint not in PD_ENDPOINTS:  # the prefill body speaks their fields only
            return
        outcome = await self.run(request, attempt)
        PREFILLS.labels(outcome.outcome.partition(":")[0]).inc()
        request.state.remote_prefill = outcome
        attempt.notes.append(outcome.note())

    async def run(self, request: RoutingRequest, attempt: Attempt) -> PrefillOutcome:
        """The prefill step for the attempt's decode backend, and how it went."""
        uncached = request.prefill_tokens(attempt.backend.id)
        if uncached < self.config.min_remote_prefill_tokens:
            return PrefillOutcome("short_suffix", uncached_tokens=uncached)
        try:
            chosen = self._choose(request, attempt.backend.id)
        except NoBackendError:
            return PrefillOutcome("no_prefill_backend", uncached_tokens=uncached)
        prefill = chosen.backend
        model = PrefillModel(request.target)
        if self.adapters is not None:
            model = self.adapters.prefill_model(request, attempt.backend.id, prefill)
        if model.skip:
            return PrefillOutcome(model.skip, prefill.id, 0.0, uncached)
        return await self._prefill(request, attempt.headers, prefill, uncached, model.model)

    def _choose(self, request: RoutingRequest, decode_id: str) -> RoutingDecision:
        """The prefill backend: a prefill-capable one other than the decode backend, through
        the pipeline (NoBackendError when there is none)."""
        candidates = [
            s
            for s in self.scheduler.eligible(request)
            if s.backend.role in PREFILL_ROLES and s.id != decode_id
        ]
        return self.scheduler.pipeline.decide(request, candidates)

    async def _prefill(
        self,
        request: RoutingRequest,
        headers: dict[str, str],
        backend: BackendState,
        uncached_tokens: int,
        model: str,
    ) -> PrefillOutcome:
        lease = backend.load.acquire(uncached_tokens)
        observers = self.scheduler.observers
        for observer in observers:
            observer.on_dispatch(request, backend)
        start = time.perf_counter()
        outcome = "cancelled"
        deadline = Deadline(self.config.prefill_timeout_s, "prefill")
        try:
            body = encode_body(prefill_body(request, model))
            status, _ = await self.relay.fetch(
                backend.url, request.path, headers, body, backend.id, deadline
            )
            outcome = "ok" if status == 200 else f"failed:status_{status}"
        except UpstreamError as exc:
            outcome = f"failed:{exc.kind}"
        finally:
            deadline.cancel()
            lease.release()
            for observer in observers:
                observer.on_finish(request, backend, outcome)
        seconds = time.perf_counter() - start
        if outcome != "ok":
            return PrefillOutcome(outcome, backend.id, seconds, uncached_tokens)
        PREFILL_S.observe(seconds)
        return PrefillOutcome("remote", backend.id, seconds, uncached_tokens)


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
