"""Passive ejection: failures on real traffic take a backend out of rotation for a lease.

After ``consecutive_failures`` failures in a row (connect errors, timeouts, retried 5xx) the
backend is ejected for ``base_lease_s``; each further ejection without a success in between
doubles the lease up to ``max_lease_s``. When the lease ends the backend takes traffic again
(half-open): one success clears everything, one failure ejects it again. No mark is permanent.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstack.router.fleet.config import EjectionConfig

__all__ = ["EjectionState"]


@dataclass(slots=True)
class EjectionState:
    failures: int = 0  # consecutive
    ejections: int = 0  # consecutive, without a success in between
    until_s: float = 0.0  # monotonic time the current lease ends

    def is_ejected(self, now_s: float) -> bool:
        return now_s < self.until_s

    def record_success(self) -> None:
        self.failures = 0
        self.ejections = 0
        self.until_s = 0.0

    def record_failure(self, config: EjectionConfig, now_s: float) -> float | None:
        """Count a failure; return the lease in seconds if this failure ejects the backend."""
        self.failures += 1
        if self.failures < config.consecutive_failures or self.is_ejected(now_s):
            return None
        lease_s = min(config.max_lease_s, config.base_lease_s * 2.0**self.ejections)
        self.ejections += 1
        self.until_s = now_s + lease_s
        return lease_s
