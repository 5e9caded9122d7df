"""The workloads ``kvstack bench lora`` reports on: a tuning seed and held-out seeds, by shape.

The weighted policy's defaults were chosen on one workload, the *tuning seed* on the first
shape (``--tuning-seed``, default 0: the stream the defaults were chosen on). A result reports
that run apart, and its figures on *held-out* seeds (``--seeds``) of every shape
(``--zipf-s``, the popularity skew within a tier), as medians with their spread; only these say
how the defaults do on a workload they were not chosen on.

Workload seed ``s`` draws the adapters' ranks from ``2 s`` and the arrivals from ``2 s + 1``,
so seed 0 is the stream ``make_adapters`` and ``make_arrivals`` give by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstack.bench.workloads.lora_zipf import (
    LoRAZipfAdapter,
    LoRAZipfArrival,
    make_adapters,
    make_arrivals,
)

__all__ = ["BenchWorkload", "bench_workloads", "parse_floats", "parse_ints", "streams"]

TUNING, HELD_OUT = "tuning", "held-out"


@dataclass(frozen=True)
class BenchWorkload:
    seed: int
    zipf_s: float
    role: str  # TUNING or HELD_OUT

    @property
    def shape(self) -> str:
        """The shape's key in results: the Zipf exponent, e.g. ``"1"``, ``"0.8"``."""
        return f"{self.zipf_s:g}"

    @property
    def key(self) -> str:
        return f"zipf{self.shape}-seed{self.seed}"


def bench_workloads(
    tuning_seed: int | None, seeds: list[int], shapes: list[float]
) -> list[BenchWorkload]:
    """The tuning seed on the first shape, then every held-out seed on every shape."""
    if not shapes:
        raise ValueError("--zipf-s: give at least one shape")
    if tuning_seed is not None and tuning_seed in seeds:
        raise ValueError(f"seed {tuning_seed} is the tuning seed; it cannot be held out too")
    if len(set(seeds)) != len(seeds) or len(set(shapes)) != len(shapes):
        raise ValueError(f"seeds {seeds} and shapes {shapes} must not repeat")
    out = [BenchWorkload(tuning_seed, shapes[0], TUNING)] if tuning_seed is not None else []
    out += [BenchWorkload(s, z, HELD_OUT) for z in shapes for s in seeds]
    return out


def streams(
    w: BenchWorkload,
    num_adapters: int,
    num_requests: int,
    rate_per_s: float,
    interactive_fraction: float,
) -> tuple[list[LoRAZipfAdapter], list[LoRAZipfArrival]]:
    adapters = make_adapters(num_adapters, w.zipf_s, seed=2 * w.seed)
    arrivals = make_arrivals(
        adapters, num_requests, rate_per_s, interactive_fraction, seed=2 * w.seed + 1
    )
    return adapters, arrivals


def parse_ints(text: str) -> list[int]:
    """``"1,2,3"``; ``""`` or ``"none"``: no seeds."""
    if text.strip().lower() in ("", "none"):
        return []
    return [int(p) for p in text.split(",")]


def parse_floats(text: str) -> list[float]:
    return [float(p) for p in text.split(",") if p.strip()]
