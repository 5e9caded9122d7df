"""``Permit``: what an admission hands a request it lets through.

A leaf, so that the request's state can hold the permit (:class:`~kvstack.router.request.
RequestState` releases it when the request ends, however it ends).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["NO_PERMIT", "Permit"]


class Permit(Protocol):
    def release(self) -> None:
        """The request ended (answered, failed or cancelled); called exactly once."""


class _NoPermit:
    __slots__ = ()

    def release(self) -> None:
        return None


NO_PERMIT: Permit = _NoPermit()
