"""The index benchmark's fleet and prompt: 8 engines (CPU and disk tiers each) and one shared
Redis store, a 128K-token prompt (512 chunks of 256 tokens) placed so every engine matches a
different prefix, random filler chunks up to the number of entries asked for, and the reports
that carry them (bulk: 65,536-key reports as a full sync sends; steady: 512-event reports of
stores and removals, as an engine's announcer sends every interval)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from kvstack.index.protocol import AnnounceBatch, EventReply, KeyProfile, LookupReply, TierInfo
from kvstack.kv.keys import Namespace, chunk_keys

__all__ = [
    "CHUNK",
    "NUM_INSTANCES",
    "PROMPT_TOKENS",
    "bulk_batches",
    "check",
    "feed",
    "prompt",
    "steady_batches",
]

CHUNK = 256
PROMPT_TOKENS = 128 * 1024
NUM_INSTANCES = 8
PROFILE = KeyProfile(model="bench-8b@1", chunk_size=CHUNK, kv_dtype="bfloat16")
SHARED = TierInfo("redis", shared=True, location="redis://bench:6379/0/kvstack:")
TIERS = [TierInfo("cpu"), TierInfo("file"), SHARED]
BATCH_KEYS = 65_536
STEADY_BATCH = 512


def prompt() -> np.ndarray[Any, Any]:
    return np.random.default_rng(7).integers(0, 128_000, PROMPT_TOKENS, dtype=np.uint32)


def expected(instance: int) -> int:
    """Engine i holds the first 64*(i+1) chunks on CPU; engine 0 all on disk; redis half."""
    cpu = 64 * (instance + 1)
    disk = 512 if instance == 0 else 0
    return max(cpu, disk, 256) * CHUNK


def _batch(
    instance: str,
    reset: bool,
    stored: dict[str, list[bytes]],
    removed: dict[str, list[bytes]] | None = None,
) -> AnnounceBatch:
    return AnnounceBatch(
        instance=instance, profile=PROFILE, aliases=["bench-8b"], tiers=TIERS, reset=reset,
        stored=stored, removed=removed or {},
    )  # fmt: skip


def bulk_batches(num_entries: int) -> Iterator[AnnounceBatch]:
    """Reports that put the prompt's chunks where :func:`expected` says, plus random filler
    keys spread over every engine and tier up to ``num_entries`` entries."""
    keys = chunk_keys(prompt(), Namespace(PROFILE.model, PROFILE.kv_dtype), CHUNK)
    rng = np.random.default_rng(1)
    filler = (num_entries - len(keys)) // NUM_INSTANCES
    for i in range(NUM_INSTANCES):
        stored: dict[str, list[bytes]] = {"cpu": list(keys[: 64 * (i + 1)]), "file": []}
        if i == 0:
            stored["file"] = list(keys)
            stored["redis"] = list(keys[:256])
        raw = rng.bytes(16 * filler)
        extra = [raw[j : j + 16] for j in range(0, len(raw), 16)]
        stored["cpu"] += extra[: filler // 2]
        stored["file"] += extra[filler // 2 :]
        first = True
        for tier, tier_keys in stored.items():
            for start in range(0, len(tier_keys), BATCH_KEYS):
                yield _batch(
                    f"engine-{i}", first, stored={tier: tier_keys[start : start + BATCH_KEYS]}
                )
                first = False


def steady_batches(num_events: int, seed: int) -> Iterator[AnnounceBatch]:
    """Reports of :data:`STEADY_BATCH` events from every engine in turn: new filler chunks
    stored, and half as many of the same report's chunks removed again (the prompt's chunks
    are never touched, so answers stay as :func:`expected` says)."""
    rng = np.random.default_rng(seed)
    for n in range(num_events // STEADY_BATCH):
        raw = rng.bytes(16 * (STEADY_BATCH * 2 // 3))
        fresh = [raw[j : j + 16] for j in range(0, len(raw), 16)]
        removed = fresh[: STEADY_BATCH - len(fresh)]
        yield _batch(f"engine-{n % NUM_INSTANCES}", False,
                     stored={"cpu": fresh}, removed={"cpu": removed})  # fmt: skip


def feed(report: Callable[[AnnounceBatch], EventReply], batches: Iterator[AnnounceBatch],
         epochs: dict[str, str]) -> int:  # fmt: skip
    """Send every batch with its engine's last epoch; the number of events sent."""
    events = 0
    for batch in batches:
        batch.epoch = epochs.get(batch.instance, "")
        reply = report(batch)
        if reply.resync:
            raise RuntimeError(f"index refused a report from {batch.instance}")
        epochs[batch.instance] = reply.epoch
        events += sum(map(len, batch.stored.values())) + sum(map(len, batch.removed.values()))
    return events


def check(reply: LookupReply) -> None:
    got = {name: m.matched_tokens for name, m in reply.instances.items()}
    want = {f"engine-{i}": expected(i) for i in range(NUM_INSTANCES)}
    if got != want:
        raise AssertionError(f"wrong lookup answer: {got} != {want}")
