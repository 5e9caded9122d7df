"""Attach a simulated engine to kvstack tiers, so that KV computed by one engine can be
"loaded" by another instead of recomputed.

The engine stores each prompt's chunks under the real kvstack chunk keys
(:mod:`kvstack.kv.keys`, through :class:`kvstack.kv.KVCache`) once its prefill is done, and
looks a new prompt up at arrival: the stored prefix beyond the engine's own prefix-cache hit
costs ``kv_bytes_per_token / tier_bytes_per_s`` per token instead of prefill time. The chunks
are tiny placeholders (4 bytes a token), so a shared ``file://`` or ``redis://`` tier is cheap;
engines of one fleet process configured with the same tier URLs share one cache object.
Tier calls block, so they run in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvstack.sim.config import SimConfig

if TYPE_CHECKING:
    from kvstack.kv.cache import KVCache
    from kvstack.kv.config import KVConfig

__all__ = ["TierLink", "tier_config"]

log = logging.getLogger(__name__)


def tier_config(config: SimConfig) -> KVConfig:
    """The ``kv`` section of the engine's tiers; ConfigError naming ``--kv-tiers`` when a tier
    URL is bad (checked by the CLI before anything heavy is imported)."""
    from pydantic import ValidationError

    from kvstack.errors import ConfigError
    from kvstack.kv.config import KVConfig

    try:
        return KVConfig(model=config.model, chunk_size=config.kv_chunk_size, tiers=config.kv_tiers)
    except ValidationError as exc:  # the tiers are the sim section's kv_tiers (--kv-tiers)
        problems = "; ".join(str(err["msg"]) for err in exc.errors())
        raise ConfigError(f"sim.kv_tiers (--kv-tiers, KVSTACK_SIM_KV_TIERS): {problems}") from None


class TierLink:
    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self._pending: set[asyncio.Task[int]] = set()

    @classmethod
    def from_config(cls, config: SimConfig) -> TierLink:
        from kvstack.kv.cache import KVCache
        from kvstack.security import load_security

        # the cluster secret (KVSTACK_SECURITY_*, as `kvstack up` passes it): sealed chunks
        return cls(KVCache(tier_config(config), keys=load_security()[1]))

    async def lookup(self, tokens: Sequence[int], adapter: str | None, salt: str | None) -> int:
        """Prompt tokens held by the tiers (a chunk-aligned prefix)."""
        return await asyncio.to_thread(self.cache.lookup, list(tokens), salt, adapter)

    def store_soon(self, tokens: Sequence[int], adapter: str | None, salt: str | None) -> None:
        """Store placeholder chunks for ``tokens`` in the background."""
        num = len(tokens) - len(tokens) % self.cache.config.chunk_size
        if num == 0:
            return
        task = asyncio.get_running_loop().create_task(
            asyncio.to_thread(self._store, list(tokens[:num]), adapter, salt)
        )
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def _store(self, tokens: list[int], adapter: str | None, salt: str | None) -> int:
        from kvstack.kv.tensors import torch

        placeholder = torch.zeros((1, 2, len(tokens), 1, 1), dtype=torch.float16)
        return self.cache.store(tokens, placeholder, salt, adapter)

    async def drain(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    def close(self) -> None:
        self.cache.close()
