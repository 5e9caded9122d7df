"""Measurements behind ``kvstack bench radix``: the router's prefix tree at scale.

A tree of ``tree_tokens`` tokens is built the way a fleet fills it: ``num_backends`` owners,
prompts made of one of ``num_systems`` shared system prompts plus a unique suffix. Then a
``prompt_tokens`` query that shares a system prompt and part of an existing suffix is matched
(every owner's prefix length) and inserted for one owner, ``rounds`` times with fresh queries;
each operation is timed alone, by the wall clock (``perf_counter``: the latency a request sees,
what the target is about) and by this thread's CPU time (``thread_time``: the work itself,
which a busy shared machine disturbs less) around the same call. A reference measured in the
same run puts the figures in scale: copying the query (``list(tokens)``), the least any prefix
lookup has to read.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvstack.bench.load.stats import percentile
from kvstack.index.radix import Owner, RadixIndex, RadixNamespace

__all__ = ["OpTiming", "RadixBenchResult", "Timing", "build_tree", "run_radix_bench"]

NS = RadixNamespace("bench-model")


@dataclass(frozen=True, slots=True)
class Timing:
    p50_us: float
    p99_us: float
    mean_us: float

    @classmethod
    def of(cls, samples_s: list[float]) -> Timing:
        """Percentiles of at least one sample."""
        us = [s * 1e6 for s in samples_s]
        p50, p99 = percentile(us, 50), percentile(us, 99)
        if p50 is None or p99 is None:
            raise ValueError("a timing needs at least one sample")
        return cls(p50, p99, statistics.fmean(us))


@dataclass(frozen=True, slots=True)
class OpTiming:
    """One operation's wall-clock latency and CPU time, over the same calls."""

    wall: Timing
    cpu: Timing

    @classmethod
    def of(cls, samples: list[tuple[float, float]]) -> OpTiming:
        """From ``(wall seconds, CPU seconds)`` per call."""
        return cls(Timing.of([w for w, _ in samples]), Timing.of([c for _, c in samples]))


@dataclass(frozen=True, slots=True)
class RadixBenchResult:
    tree_tokens: int
    tree_nodes: int
    build_s: float
    prompt_tokens: int
    matched_tokens: int
    rounds: int
    match: OpTiming
    insert: OpTiming
    match_insert: OpTiming
    copy_reference: OpTiming


def build_tree(
    tree_tokens: int,
    page_size: int,
    num_backends: int,
    num_systems: int,
    rng: random.Random,
) -> tuple[RadixIndex, list[list[int]], list[list[int]]]:
    """A tree holding ~``tree_tokens`` tokens; returns it, the system prompts and the prompts."""
    index = RadixIndex(page_size=page_size)
    systems = [_tokens(rng, 2048) for _ in range(num_systems)]
    prompts: list[list[int]] = []
    while index.num_tokens < tree_tokens:
        # Mostly chat-sized suffixes, and one prompt in five a long document.
        suffix = rng.randrange(16384, 30720) if rng.random() < 0.2 else rng.randrange(256, 8192)
        prompt = rng.choice(systems) + _tokens(rng, suffix)
        index.insert(NS, prompt, Owner(f"b{rng.randrange(num_backends)}"))
        prompts.append(prompt)
    return index, systems, prompts


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(32000) for _ in range(n)]


def _query(rng: random.Random, prompts: list[list[int]], prompt_tokens: int) -> list[int]:
    """A prompt sharing three quarters of an existing prompt, then new tokens."""
    base = rng.choice(prompts)
    keep = base[: min(len(base), prompt_tokens) * 3 // 4]
    return keep + _tokens(rng, prompt_tokens - len(keep))


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall-clock and this thread's CPU seconds of one call: the wall clock is the latency
    (it includes waiting for a core on a busy machine), CPU time the work alone."""
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - wall, time.thread_time() - cpu


def run_radix_bench(
    tree_tokens: int = 1_000_000,
    prompt_tokens: int = 32_768,
    page_size: int = 16,
    num_backends: int = 16,
    num_systems: int = 64,
    rounds: int = 200,
    seed: int = 0,
) -> RadixBenchResult:
    rng = random.Random(seed)
    start = time.perf_counter()
    index, _, prompts = build_tree(tree_tokens, page_size, num_backends, num_systems, rng)
    build_s = time.perf_counter() - start
    match_s: list[tuple[float, float]] = []
    insert_s: list[tuple[float, float]] = []
    both_s: list[tuple[float, float]] = []
    copy_s: list[tuple[float, float]] = []
    matched = 0
    owner = Owner("bench-owner")
    for _ in range(rounds):  # each operation on a fresh query, interleaved with the others
        query = _query(rng, prompts, prompt_tokens)
        copy_s.append(_timed(lambda q=query: list(q)))  # type: ignore[misc]
        match_s.append(_timed(lambda q=query: index.match(NS, q)))  # type: ignore[misc]
        matched += index.match(NS, query).best()
        insert_s.append(_timed(lambda q=query: index.insert(NS, q, owner)))  # type: ignore[misc]
        index.drop_owner(owner)  # keep the tree at its size
        query = _query(rng, prompts, prompt_tokens)
        both_s.append(
            _timed(lambda q=query: (index.match(NS, q), index.insert(NS, q, owner)))  # type: ignore[misc]
        )
        index.drop_owner(owner)
    return RadixBenchResult(
        tree_tokens=index.num_tokens,
        tree_nodes=index.num_nodes,
        build_s=build_s,
        prompt_tokens=prompt_tokens,
        matched_tokens=matched // rounds,
        rounds=rounds,
        match=OpTiming.of(match_s),
        insert=OpTiming.of(insert_s),
        match_insert=OpTiming.of(both_s),
        copy_reference=OpTiming.of(copy_s),
    )
