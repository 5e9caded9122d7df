"""Admission: may this request go to a backend now? The seam for priorities and shedding.

The proxy calls ``await admission.admit(request)`` after parsing and model routing and before
the pipeline picks a backend; the returned :class:`~kvstack.router.admission.permit.Permit`
goes into the request's state, which releases it when the request ends however it ends.
Because the backend is chosen only after ``admit`` returns, a queueing admission gets late
binding for free. An admission sheds a request by raising :class:`~kvstack.errors.RequestError`
(429 with ``retry_after_s``). Registered: ``immediate`` (every request at once) and
``priority`` (:mod:`kvstack.router.admission.priority`).
"""

from __future__ import annotations

from kvstack.registry import Registry
from kvstack.router.admission.permit import NO_PERMIT, Permit
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.plugins.base import Plugin

__all__ = ["ADMISSIONS", "Admission", "ImmediateAdmission"]


class Admission(Plugin):
    async def admit(self, request: RoutingRequest) -> Permit:
        """Wait until ``request`` may be dispatched, or raise RequestError to shed it."""
        raise NotImplementedError


class ImmediateAdmission(Admission):
    """Every request goes at once."""

    name = "immediate"

    async def admit(self, request: RoutingRequest) -> Permit:
        return NO_PERMIT


ADMISSIONS: Registry[type[Admission]] = Registry("admission")
ADMISSIONS.register("immediate", ImmediateAdmission)
ADMISSIONS.register("priority", "kvstack.router.admission.priority:PriorityAdmission")
