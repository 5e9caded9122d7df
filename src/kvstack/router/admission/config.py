"""Settings of the ``priority`` admission (``router.admission.args``)::

admission:
  name: priority
  args:
    default: standard
    models: {batch-summarizer: sheddable}
    tenants: {acme: critical}
    queues:
      standard: {max_queued: 1000, timeout_s: 30}
      sheddable: {max_queued: 0}          # shed at once when saturated
    saturation: {max_waiting: 5, max_kv_usage: 0.9, max_pending: 16}
    retry_after_s: 2
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from kvstack.router.fleet.saturation import SaturationLimits
from kvstack.section import Section

__all__ = ["PRIORITIES", "Priority", "PriorityConfig", "QueueLimits", "SaturationConfig"]

Priority = Literal["critical", "standard", "sheddable"]
PRIORITIES: tuple[Priority, ...] = ("critical", "standard", "sheddable")


class QueueLimits(Section):
    max_queued: int = Field(
        default=1000, ge=0, description="requests held while saturated; more are shed (429)"
    )
    timeout_s: float = Field(
        default=30.0, gt=0, description="a request held longer is shed (429 + Retry-After)"
    )


class SaturationConfig(Section):
    max_waiting: float | None = Field(
        default=5.0, ge=0, description="engine-queued requests beyond which a backend is full"
    )
    max_kv_usage: float | None = Field(
        default=0.9, gt=0, le=1, description="KV usage at which a backend is full"
    )
    max_pending: int | None = Field(
        default=16,
        ge=1,
        description="router requests awaiting their first token on one backend (the queue "
        "without a scrape's delay)",
    )
    max_in_flight: int | None = Field(
        default=None, ge=1, description="router requests in flight on one backend"
    )
    stale_saturates: bool = Field(
        default=True,
        description="a backend whose metrics are stale counts as full (nothing says it is "
        "not); ignored when scraping is off",
    )

    def limits(self, scraping: bool) -> SaturationLimits:
        return SaturationLimits(
            self.max_waiting,
            self.max_kv_usage,
            self.max_in_flight,
            self.max_pending,
            self.stale_saturates and scraping,
        )


def _default_queues() -> dict[str, QueueLimits]:
    return {"standard": QueueLimits(), "sheddable": QueueLimits(max_queued=0, timeout_s=5.0)}


class PriorityConfig(Section):
    default: Priority = Field(default="standard", description="priority of unlabelled requests")
    models: dict[str, Priority] = Field(
        default_factory=dict, description="model name (as asked) -> priority"
    )
    tenants: dict[str, Priority] = Field(
        default_factory=dict, description="tenant (from the API key) -> priority"
    )
    queues: dict[str, QueueLimits] = Field(
        default_factory=_default_queues,
        description="per-priority queues (standard, sheddable); critical requests are never "
        "held or shed",
    )
    saturation: SaturationConfig = Field(
        default_factory=SaturationConfig, description="when the candidates are full"
    )
    retry_after_s: float = Field(default=1.0, gt=0, description="Retry-After of a shed request")
    tick_s: float = Field(
        default=0.05, gt=0, description="queue re-check period (besides request completions)"
    )

    @field_validator("queues")
    @classmethod
    def _queues(cls, value: dict[str, QueueLimits]) -> dict[str, QueueLimits]:
        bad = sorted(set(value) - {"standard", "sheddable"})
        if bad:
            raise ValueError(f"queues are per priority standard and sheddable, got {bad}")
        return {**_default_queues(), **value}

    def queue(self, priority: str) -> QueueLimits:
        return self.queues[priority]
