"""One attempt at one backend, and the steps that shape it before it is sent.

Per attempt the proxy decides (a :class:`~kvstack.router.scheduling.pipeline.RoutingDecision`),
wraps the decision in an :class:`Attempt`, runs every :class:`AttemptStep` on it in order, then
sends it::

    attempt = Attempt(number, decision, body, headers)
    for step in steps:  await step.before_attempt(request, attempt)
    send attempt.body to attempt.backend; add attempt.response_headers to the answer

The router's steps: the adapter stage (:mod:`kvstack.router.adapters`: load the request's LoRA
adapter on the chosen backend, rewrite the body's ``model``) and then prefill/decode
(:mod:`kvstack.router.pd.step`: on the first attempt, prefill the prompt on another backend).
A step that holds something for the attempt lets go of it when the attempt ends, as a
:class:`~kvstack.router.scheduling.plugins.base.RequestObserver` (``on_finish``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from kvstack.router.fleet.backends import BackendState
from kvstack.router.http.responses import RawHeaders
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.pipeline import RoutingDecision

__all__ = ["Attempt", "AttemptStep"]


@dataclass(slots=True)
class Attempt:
    """What one attempt sends, where, and what it adds to the answer."""

    number: int  # 1 for the first
    decision: RoutingDecision
    body: bytes  # to the backend
    headers: dict[str, str]  # to the backend
    response_headers: RawHeaders = field(default_factory=list)  # added to the client's answer
    notes: list[str] = field(default_factory=list)  # appended to the decision header

    @property
    def backend(self) -> BackendState:
        return self.decision.backend

    def public_decision_header(self) -> str:
        """The ``x-kvstack-decision`` value for callers without the admin key: the backend and
        the reason only (no match counts, scores or another backend's state)."""
        return f"backend={self.decision.backend.id};reason={self.decision.reason}"

    def decision_header(self) -> str:
        """The full ``x-kvstack-decision`` header value (admin key or ``debug_headers``)."""
        parts = [self.decision.header(), *self.notes]
        if self.number > 1:
            parts.append(f"attempt={self.number}")
        return ";".join(parts)


class AttemptStep(Protocol):
    async def before_attempt(self, request: RoutingRequest, attempt: Attempt) -> None:
        """Shape ``attempt`` (its body, headers, notes) before it is sent, or refuse it with a
        RequestError; runs on the event loop, bounded in time."""
