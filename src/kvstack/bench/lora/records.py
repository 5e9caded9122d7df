"""What one arm of the adapter-cache benchmark records: a line per request and the counters,
alike in both modes (simulated engines and discrete events)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ArmResult", "RequestRecord"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    tier: str
    interactive: bool
    start: str  # residency at arrival on the chosen engine: hot, warm, cold
    action: str
    reason: str
    ttft_s: float | None  # simulated seconds; None when refused or failed
    after_warmup: bool
    wrong_version: bool


@dataclass
class ArmResult:
    arm: str  # a name of kvstack.bench.lora.arms.ARMS
    records: list[RequestRecord] = field(default_factory=list)
    cold_loads: int = 0  # fetches from the artifact store after warmup
    engine_loads: int = 0  # engine loads after warmup
    invariants: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
