"""The discovery interface: publish complete snapshots of the backend set.

A source calls ``publish`` with the *whole* current set every time it changes (never deltas),
so a missed event is repaired by the next snapshot and the pool cannot keep ghost backends.
``publish`` must be called on the router's event loop (a threaded source hops with
``loop.call_soon_threadsafe``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from kvstack.router.config import RouterConfig
from kvstack.router.fleet.backends import Backend

__all__ = ["Discovery", "Publish"]

Publish = Callable[[Sequence[Backend]], None]


class Discovery(ABC):
    @classmethod
    @abstractmethod
    def from_config(cls, config: RouterConfig) -> Discovery:
        """Build the source from the router's config."""

    @abstractmethod
    async def start(self, publish: Publish) -> None:
        """Publish the first snapshot before returning (when the source can), then keep
        publishing changes until ``close``."""

    @abstractmethod
    async def close(self) -> None:
        """Stop publishing."""
