"""Configuration of the ``bench`` section: defaults of the load generator and the runner."""

from __future__ import annotations

from pydantic import Field

from kvstack.section import Section

__all__ = ["BenchConfig"]


class BenchConfig(Section):
    slo_ttft_s: float | None = Field(
        default=2.0, gt=0, description="goodput SLO: time to first token (None: no bound)"
    )
    slo_tpot_s: float | None = Field(
        default=0.1, gt=0, description="goodput SLO: time per output token (None: no bound)"
    )
    timeout_s: float = Field(default=600.0, gt=0, description="per-request timeout (wall)")
    drain_timeout_s: float = Field(
        default=120.0, ge=0, description="wall time to let running requests finish at the end"
    )
    start_timeout_s: float = Field(
        default=300.0, gt=0, description="compare: wait for a fleet or front end to be healthy"
    )
