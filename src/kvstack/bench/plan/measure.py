"""``kvstack plan --measure-fixed-costs``: what one load costs kvstack before its bytes move.

The connector's per-request path, measured here with the library it runs: the chunk keys of a
one-chunk prompt (BLAKE2b over its tokens), the prefix lookup (``contains_prefix``), the hop
the scheduler's lookup takes to the worker (a ZeroMQ IPC request and reply), and the load of
the chunk into a caller buffer from the ``cpu://`` tier. The chunk is tiny, so the figure is
the fixed part: bytes are the tier bandwidth's business. Medians and spreads of ``rounds``
repetitions; nothing on a GPU is measured (the copy launch and the engine step a load waits
are ``load_wait_s``, which only a running engine shows).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstack.bench.load.stats import percentile

__all__ = ["FixedCosts", "measure_fixed_costs"]

CHUNK_TOKENS = 256


@dataclass(frozen=True, slots=True)
class FixedCosts:
    """Seconds per step: (median, p10, p90) of each, and their medians' sum."""

    keys_s: tuple[float, float, float]
    lookup_s: tuple[float, float, float]
    ipc_s: tuple[float, float, float]
    load_s: tuple[float, float, float]
    rounds: int

    @property
    def total_s(self) -> float:
        return self.keys_s[0] + self.lookup_s[0] + self.ipc_s[0] + self.load_s[0]

    def lines(self) -> list[str]:
        def row(name: str, figure: tuple[float, float, float]) -> str:
            median, low, high = (x * 1e6 for x in figure)
            return f"  {name:<28} {median:8.1f} us (p10 {low:.1f}, p90 {high:.1f})"

        return [
            f"kvstack's fixed cost per load on this host ({self.rounds} rounds):",
            row("chunk keys (256 tokens)", self.keys_s),
            row("prefix lookup", self.lookup_s),
            row("ZeroMQ IPC round trip", self.ipc_s),
            row("load one chunk (cpu://)", self.load_s),
            f"  total (medians)              {self.total_s * 1e6:8.1f} us -> load_fixed_s",
        ]


def _timed(fn: Callable[[], Any], rounds: int) -> tuple[float, float, float]:
    for _ in range(max(3, rounds // 10)):  # warm up
        fn()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    low, high = percentile(samples, 10), percentile(samples, 90)
    assert low is not None and high is not None
    return statistics.median(samples), low, high


def _ipc_round_trip(rounds: int) -> tuple[float, float, float]:
    import zmq

    context = zmq.Context()
    with tempfile.TemporaryDirectory() as folder:
        address = f"ipc://{Path(folder) / 'lookup'}"
        server, client = context.socket(zmq.REP), context.socket(zmq.REQ)
        server.bind(address)
        client.connect(address)
        request = b"\0" * (16 * 2)  # two 128-bit chunk keys

        def one() -> None:
            client.send(request)
            server.send(server.recv())
            client.recv()

        try:
            return _timed(one, rounds)
        finally:
            client.close(0)
            server.close(0)
            context.term()


def measure_fixed_costs(rounds: int = 500) -> FixedCosts:
    """Measure on this host (needs the ``kv`` and ``server`` extras)."""
    import torch

    from kvstack.kv import KVCache

    cache = KVCache.from_config({"model": "plan-measure", "chunk_size": CHUNK_TOKENS,
                                 "tiers": ["cpu://?size=64MiB"]})  # fmt: skip
    try:
        tokens = list(range(100, 100 + CHUNK_TOKENS))
        kv = torch.zeros(2, 2, CHUNK_TOKENS, 1, 8, dtype=torch.float16)
        cache.store(tokens, kv)
        keys = cache.chunk_keys(tokens)
        out = [torch.empty_like(kv)]
        return FixedCosts(
            keys_s=_timed(lambda: cache.chunk_keys(tokens), rounds),
            lookup_s=_timed(lambda: cache.contains_prefix(keys), rounds),
            ipc_s=_ipc_round_trip(rounds),
            load_s=_timed(lambda: cache.get_chunks_into(keys, out), rounds),
            rounds=rounds,
        )
    finally:
        cache.close()
