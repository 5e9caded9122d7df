"""A request inside the simulated engine: its tokens, its KV blocks and its timeline.

The scheduler owns the state fields; HTTP handlers read ``tokens[num_prompt:]`` as the output
and wait on :meth:`SimRequest.wait_for_progress`. All times are simulated seconds.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from kvstack.sim.blocks import KVBlock
from kvstack.sim.hashing import BlockHash

__all__ = ["Adapter", "FinishReason", "RequestStatus", "SimRequest"]


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    LENGTH = "length"
    ABORT = "abort"


@dataclass(frozen=True, slots=True)
class Adapter:
    """A registered LoRA adapter (vLLM's ``LoRARequest``: name, path, integer id)."""

    name: str
    path: str
    int_id: int


@dataclass(eq=False, slots=True)
class SimRequest:
    request_id: str
    tokens: list[int]  # prompt, then each output token as it is sampled
    num_prompt: int
    max_tokens: int
    arrival_s: float
    adapter: Adapter | None = None
    priority: int = 0
    cache_salt: str | None = None
    tier_hit_tokens: int = 0  # prompt tokens a kvstack tier holds (looked up at arrival)
    stream: bool = False  # wake the handler at every token, not only at the end
    # -- scheduler state ------------------------------------------------------------------
    status: RequestStatus = RequestStatus.WAITING
    num_computed: int = 0  # tokens whose KV is in the engine
    blocks: list[KVBlock] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)  # of full blocks of `tokens`
    num_cached_blocks: int = 0  # leading blocks registered in the prefix cache
    aborted: bool = False
    finish_reason: FinishReason | None = None
    rng_state: int = 0
    # -- timeline and accounting ----------------------------------------------------------
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    prev_token_s: float | None = None  # the token before the last (inter-token latency)
    finished_s: float | None = None
    num_preemptions: int = 0
    local_hit_tokens: int = 0
    external_hit_tokens: int = 0
    computed_prompt_tokens: int = 0
    _waiter: asyncio.Future[None] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def lora(self) -> tuple[str, str] | None:
        return None if self.adapter is None else (self.adapter.name, self.adapter.path)

    def notify(self) -> None:
        """Wake the handler waiting for new tokens (called by the engine after each step)."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def progress(self) -> asyncio.Future[None]:
        """Done after the next step that produces tokens for this request or finishes it.

        Created at the call, not when awaited, so a handler waiting on several requests
        misses no step between its check and its wait."""
        if self._waiter is None or self._waiter.done():
            self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter

    async def wait_for_progress(self) -> None:
        """Return after the next step that produced tokens for this request or finished it."""
        await self.progress()
