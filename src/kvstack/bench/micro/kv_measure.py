"""Measurements behind ``kvstack bench kv``: tier throughput and its references, per shape.

Every figure is a median over rounds; within a round the references and the tiers run one after
the other on the same data, and a ratio is the median of the per-round ratios (each round's
tier figure over *that* round's reference), with their range, so load that drifts during the
run hits a tier and its reference alike. The references' own GB/s are kept too (median and
range), and every round's figures (``samples``), so a ratio can be checked against its parts
(:mod:`kvstack.bench.micro.kv_figures`). Each round stores chunks under new keys (the CPU tier
is full and evicts, as in steady state) and reads back what it just stored (the page cache is
warm for the file tier, as for a hot disk tier).

- memcpy: ``torch`` copy of each chunk into a preallocated buffer (the same thread settings as
  the CPU tier's copies);
- raw write: one new file per chunk, ``write`` + (``fsync``) + close, no checksum, measured next
  to each file-tier variant with that variant's ``fsync`` setting;
- raw read: ``readinto`` of those files into preallocated buffers (page cache warm).

The cluster secret, on and off in the same run: ``cpu+mac`` is the CPU tier of a cache that has
the secret (it seals nothing and checks nothing: its bytes never leave the process, see
:mod:`kvstack.kv.seal`), ``cpu+verify`` what checking every CPU-tier hit would cost (a store
that seals each chunk and a retrieve that checks it, not what kvstack does), and file variants
with ``mac`` seal on write and check on read, against the same raw file references.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

from kvstack.bench.micro.kv_figures import Samples, ShapeResult, summarise
from kvstack.kv.keys import ChunkKey
from kvstack.kv.seal import ChunkSealer
from kvstack.kv.tensors import byte_view, torch
from kvstack.kv.tiers import Tier
from kvstack.kv.tiers.cpu.tier import CPUTier
from kvstack.kv.tiers.file.tier import FileTier
from kvstack.kv.trust import ChunkTrust
from kvstack.security import ClusterKeys

__all__ = ["CLOCKS", "Shape", "Variant", "kv_like", "measure_shape"]

Clock = Callable[[], float]
# wall: elapsed time (what the bars are about). cpu: CPU time of every thread of this process,
# a proxy that a busy shared machine disturbs far less; it does not see time spent waiting for
# the disk, so fsync figures mean nothing with it.
CLOCKS: dict[str, Clock] = {"wall": time.perf_counter, "cpu": time.process_time}


class Shape(NamedTuple):
    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    chunk_tokens: int
    dtype: torch.dtype

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        return (self.num_layers, 2, self.chunk_tokens, self.num_kv_heads, self.head_dim)

    @property
    def chunk_bytes(self) -> int:
        return int(torch.Size(self.chunk_shape).numel()) * self.dtype.itemsize


class Variant(NamedTuple):
    name: str
    fsync: bool
    compression: str
    mac: bool = False  # with a cluster secret: sealed on write, checked on read


# A fixed, benchmark-only secret: what it keys does not matter, only the work it costs.
BENCH_KEYS = ClusterKeys(b"kvstack-bench-kv-secret-not-for-use".ljust(32, b"."))


def measure_shape(
    shape: Shape,
    num_chunks: int,
    rounds: int,
    root: Path,
    variants: list[Variant],
    step: Callable[[str], None],
    clock: Clock = time.perf_counter,
) -> ShapeResult:
    """Run ``rounds`` rounds over ``num_chunks`` chunks of ``shape`` under ``root``."""
    chunks = [kv_like(shape, i) for i in range(num_chunks)]
    outs = [torch.zeros_like(c) for c in chunks]  # touched: no page faults in a timed copy
    size = num_chunks * (shape.chunk_bytes + 64)
    cpus = {
        "cpu": CPUTier(size, name=f"bench-cpu-{shape.name}"),
        "cpu+mac": CPUTier(size, name=f"bench-cpu-mac-{shape.name}"),
    }
    cpus["cpu+mac"].trust = ChunkTrust(ChunkSealer(BENCH_KEYS))
    files = {v.name: _file_tier(root / v.name, v, num_chunks, shape) for v in variants}
    samples: Samples = {}
    try:
        for cpu in cpus.values():  # faults the arenas in: later rounds evict and reuse them
            _fill(cpu, chunks, "warmup", clock)
        for r in range(rounds):
            step(f"{shape.name}: round {r + 1}/{rounds}")
            _Round(r, chunks, outs, samples, clock).run(cpus, files, variants, root / "raw")
    finally:
        for tier in [*cpus.values(), *files.values()]:
            tier.close()
    fsync = {v.name: v.fsync for v in variants}
    bytes_read = {name: tier.stats().bytes_read for name, tier in files.items()}
    return summarise(shape.name, shape.chunk_bytes, num_chunks, fsync, bytes_read, samples)


def kv_like(shape: Shape, seed: int) -> torch.Tensor:
    """Values shaped like real KV: normal per channel with per-channel scales (so codecs see
    realistic exponent bytes, not random bits)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.rand(shape.num_kv_heads, shape.head_dim, generator=g) * 4 + 0.1
    return (torch.randn(shape.chunk_shape, generator=g) * scale).to(shape.dtype)


def _file_tier(path: Path, v: Variant, num_chunks: int, shape: Shape) -> FileTier:
    budget = 4 * num_chunks * (shape.chunk_bytes + 4096)
    return FileTier(
        path,
        budget,
        fsync=v.fsync,
        compression=v.compression,
        queue_depth=num_chunks + 1,
        queue_bytes=budget,
        name=f"bench-{v.name}-{shape.name}",
        trust=ChunkTrust(ChunkSealer(BENCH_KEYS)) if v.mac else None,
    )


@dataclass
class _Round:
    """One round: every tier next to its reference, each pair in alternating order."""

    r: int
    chunks: list[torch.Tensor]
    outs: list[torch.Tensor]
    samples: Samples
    clock: Clock

    def run(
        self, cpus: dict[str, CPUTier], files: dict[str, FileTier], variants: list[Variant],
        raw: Path,
    ) -> None:  # fmt: skip
        _in_turn(self.r, self.memcpy, partial(self.cpu_tier, cpus["cpu"], "cpu"))
        _in_turn(self.r, partial(self.cpu_tier, cpus["cpu+mac"], "cpu+mac"), self.cpu_verify)
        for v in variants:
            self.file_tier(
                files[v.name], v, [raw / f"{i}.{self.r}" for i in range(len(self.chunks))]
            )

    def record(self, name: str, seconds: float) -> None:
        total = sum(c.numel() * c.element_size() for c in self.chunks)
        self.samples.setdefault(name, []).append(total / seconds / 1e9)

    def timed(self, name: str, fn: Callable[[], object]) -> None:
        self.record(name, _timed(self.clock, fn))

    def memcpy(self) -> None:
        self.timed(
            "memcpy", lambda: [o.copy_(c) for o, c in zip(self.outs, self.chunks, strict=True)]
        )

    def cpu_tier(self, cpu: CPUTier, name: str) -> None:
        keys = self.store(cpu, f"{name}.store")
        self.timed(f"{name}.retrieve", partial(_get_all, cpu, keys, self.outs))

    def cpu_verify(self) -> None:
        """What a CPU tier that sealed every store and checked every hit would cost: a memcpy
        plus the MAC over the same bytes (the copy's destination, as a check would read it)."""
        sealer = ChunkSealer(BENCH_KEYS)
        pairs = list(zip(self.outs, self.chunks, strict=True))
        self.timed("cpu+verify.store", lambda: [_copy_and_mac(sealer, o, c) for o, c in pairs])
        self.timed("cpu+verify.retrieve", lambda: [_copy_and_mac(sealer, o, c) for o, c in pairs])

    def file_tier(self, tier: FileTier, v: Variant, paths: list[Path]) -> None:
        keys: list[ChunkKey] = []
        write_ref = partial(
            self.timed, f"{v.name}.ref.write", partial(_raw_write, paths, self.chunks, v.fsync)
        )
        _in_turn(self.r, write_ref, lambda: keys.extend(self.store(tier, f"{v.name}.store")))
        read_ref = partial(self.timed, f"{v.name}.ref.read", partial(_raw_read, paths, self.outs))
        read = partial(self.timed, f"{v.name}.retrieve", partial(_get_all, tier, keys, self.outs))
        _in_turn(self.r, read_ref, read)
        for path in paths:
            path.unlink()
        for key in keys:
            tier.remove(key)

    def store(self, tier: Tier, name: str) -> list[ChunkKey]:
        return _fill(tier, self.chunks, f"r{self.r}", self.clock, partial(self.record, name))


def _in_turn(r: int, first: Callable[[], None], second: Callable[[], None]) -> None:
    """Run the pair, the other way round in odd rounds: whichever runs first pays for the
    previous step's leftovers (dirty pages being written back, caches), so neither always does."""
    for step in (first, second) if r % 2 == 0 else (second, first):
        step()


def _fill(
    tier: Tier,
    chunks: list[torch.Tensor],
    tag: str,
    clock: Clock,
    timer: Callable[[float], None] | None = None,
) -> list[ChunkKey]:
    """Store every chunk under a new key; the time includes writing it out (``flush``)."""
    keys = [
        ChunkKey(hashlib.blake2b(f"{tag}-{i}".encode(), digest_size=16).digest())
        for i in range(len(chunks))
    ]
    start = clock()
    accepted = [tier.put(k, c) for k, c in zip(keys, chunks, strict=True)]
    tier.flush()
    seconds = clock() - start
    if not all(accepted) or not all(tier.contains_many(keys)):
        raise RuntimeError(f"tier {tier.name} did not store every benchmark chunk")
    if timer is not None:
        timer(seconds)
    return keys


def _copy_and_mac(sealer: ChunkSealer, out: torch.Tensor, chunk: torch.Tensor) -> bytes:
    out.copy_(chunk)
    _, mac = sealer.begin_seal(b"\0" * 16)
    mac.update(byte_view(out))
    return mac.tag(b"")


def _get_all(tier: Tier, keys: list[ChunkKey], outs: list[torch.Tensor]) -> None:
    if not all(tier.get_many_into(keys, outs)):
        raise RuntimeError(f"tier {tier.name} missed a chunk it had just stored")


def _raw_write(paths: list[Path], chunks: list[torch.Tensor], fsync: bool) -> None:
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for path, chunk in zip(paths, chunks, strict=True):
        with open(path, "wb", buffering=0) as f:
            f.write(byte_view(chunk))
            if fsync:
                os.fsync(f.fileno())


def _raw_read(paths: list[Path], outs: list[torch.Tensor]) -> None:
    for path, out in zip(paths, outs, strict=True):
        with open(path, "rb", buffering=0) as f:
            f.readinto(byte_view(out))


def _timed(clock: Clock, fn: Callable[[], object]) -> float:
    start = clock()
    fn()
    return clock() - start
