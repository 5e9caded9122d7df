"""Admission: may this request go to a backend now? The seam for priorities and shedding.

The proxy calls ``await admission.admit(request)`` after parsing and model routing and before
the pipeline picks a backend, and releases the returned permit when the request ends however
it ends. Because the backend is chosen only after ``admit`` returns, a queueing admission
gets late binding for free. An admission sheds a request by raising
:class:`~kvstack.errors.RequestError` (429 with ``retry_after_s``). Part 1 ships the trivial
``immediate`` admission; part 2 the ``priority`` admission
(:mod:`kvstack.router.admission.priority`).
"""

from __future__ import annotations

from typing import Protocol

from kvstack.registry import Registry
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.plugins.base import Plugin

__all__ = ["ADMISSIONS", "Admission", "ImmediateAdmission", "Permit"]


class Permit(Protocol):
    def release(self) -> None:
        """The request ended (answered, failed or cancelled); called exactly once."""


class Admission(Plugin):
    async def admit(self, request: RoutingRequest) -> Permit:
        """Wait until ``request`` may be dispatched, or raise RequestError to shed it."""
        raise NotImplementedError


class _NoPermit:
    __slots__ = ()

    def release(self) -> None:
        return None


_NO_PERMIT = _NoPermit()


class ImmediateAdmission(Admission):
    """Every request goes at once."""

    name = "immediate"

    async def admit(self, request: RoutingRequest) -> Permit:
        return _NO_PERMIT


ADMISSIONS: Registry[type[Admission]] = Registry("admission")
ADMISSIONS.register("immediate", ImmediateAdmission)
ADMISSIONS.register("priority", "kvstack.router.admission.priority:PriorityAdmission")
