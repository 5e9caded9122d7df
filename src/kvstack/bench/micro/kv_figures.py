"""The figures of ``kvstack bench kv`` from its rounds: medians, per-round ratios, spreads.

A ratio is computed per round first (the tier's GB/s over the GB/s of the reference measured
next to it in that round), then summarised as the median and range over rounds; the references'
own GB/s (memcpy, raw write, raw write with fsync, raw read) are kept beside, with every round's
samples, so a reader can check each ratio against its parts.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

__all__ = ["RoundSpread", "Samples", "ShapeResult", "TierResult", "summarise"]

Samples = dict[str, list[float]]


@dataclass
class RoundSpread:
    """A median over rounds with the smallest and largest round."""

    median: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> RoundSpread:
        return cls(statistics.median(values), min(values), max(values))


@dataclass
class TierResult:
    store_gbps: float
    retrieve_gbps: float
    store_ratio: float  # median of per-round ratios against the same round's reference
    retrieve_ratio: float
    store_ratio_spread: RoundSpread
    retrieve_ratio_spread: RoundSpread
    store_ref: str  # the reference of each ratio (a key of ShapeResult.references)
    retrieve_ref: str
    compression_ratio: float = 1.0  # raw bytes / stored bytes


@dataclass
class ShapeResult:
    shape: str
    chunk_bytes: int
    num_chunks: int
    memcpy_gbps: float
    file_write_gbps: float
    file_read_gbps: float
    file_write_fsync_gbps: float | None
    references: dict[str, RoundSpread] = field(default_factory=dict)  # GB/s, over rounds
    tiers: dict[str, TierResult] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)  # GB/s of every round


def summarise(
    shape: str,
    chunk_bytes: int,
    num_chunks: int,
    fsync: dict[str, bool],
    bytes_read: dict[str, int],
    samples: Samples,
) -> ShapeResult:
    """One shape's figures from every round's ``samples`` (GB/s by name: ``memcpy``,
    ``cpu.store``, ``file.ref.write``, ...); ``fsync`` names the file variants (in order) and
    their setting, ``bytes_read`` what each file tier read from disk (for compression)."""
    med = {name: statistics.median(values) for name, values in samples.items()}

    def ratio(name: str, ref: str) -> RoundSpread:
        # Per round first: a tier and its reference ran seconds apart, so load that drifts
        # over the run cancels out of their ratio.
        return RoundSpread.of([a / b for a, b in zip(samples[name], samples[ref], strict=True)])

    def tier(
        name: str, against: tuple[str, str], names: tuple[str, str], compression: float = 1.0
    ) -> TierResult:
        store = ratio(f"{name}.store", against[0])
        retrieve = ratio(f"{name}.retrieve", against[1])
        return TierResult(
            med[f"{name}.store"], med[f"{name}.retrieve"], store.median, retrieve.median,
            store, retrieve, names[0], names[1], compression,
        )  # fmt: skip

    first = {on: name for name, on in reversed(fsync.items())}  # the first variant of each
    references = {"memcpy": "memcpy", "raw write": f"{first[False]}.ref.write",
                  "raw read": f"{first[False]}.ref.read"}  # fmt: skip
    if True in first:
        references["raw write+fsync"] = f"{first[True]}.ref.write"
    result = ShapeResult(
        shape,
        chunk_bytes,
        num_chunks,
        med["memcpy"],
        med[references["raw write"]],
        med[references["raw read"]],
        med[references["raw write+fsync"]] if True in first else None,
        references={name: RoundSpread.of(samples[key]) for name, key in references.items()},
        samples=samples,
    )
    for name in ("cpu", "cpu+mac", "cpu+verify"):
        result.tiers[name] = tier(name, ("memcpy", "memcpy"), ("memcpy", "memcpy"))
    raw_bytes_read = num_chunks * chunk_bytes * len(samples["memcpy"])
    for name, on in fsync.items():
        stored = bytes_read[name]
        result.tiers[name] = tier(
            name,
            (f"{name}.ref.write", f"{name}.ref.read"),
            ("raw write+fsync" if on else "raw write", "raw read"),
            raw_bytes_read / stored if stored else 1.0,
        )
    return result
