"""Continuous batching over the simulated KV cache, shaped like vLLM v1's scheduler.

Each step (:meth:`Scheduler.schedule`, then :meth:`Scheduler.complete` at the step's end):

1. running requests first, in admission order: each gets the rest of its prompt (chunked to
   the step's token budget) or one decode token; when a request needs a block and none is
   free, the last admitted (or lowest-priority) running request is preempted: its blocks are
   freed and it goes back to the front of the waiting queue to be recomputed;
2. then, if nothing was preempted, waiting requests are admitted while the budget, the batch
   size and the blocks allow: prefix-cache hits (full blocks, at most ``num_tokens - 1``
   tokens, as vLLM) and tier hits are not recomputed; a request whose adapter would exceed
   ``max_loras`` distinct adapters in the batch waits ("deferred") and later ones may pass it;
   a request that does not fit in the free blocks blocks the queue (head of line);
3. at the step's end every request whose tokens are all computed samples one token; blocks
   that became full enter the prefix cache (a stored event each); finished requests free
   their blocks.

Pure and synchronous: the engine drives it in (scaled) time and turns outcomes into HTTP
output, metrics and KV events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstack.sim.blocks import BlockPool, KVBlock
from kvstack.sim.config import SimConfig
from kvstack.sim.hashing import BlockHash, chain_block_hashes
from kvstack.sim.lora import LoRASlots
from kvstack.sim.queue import WaitQueue
from kvstack.sim.request import FinishReason, RequestStatus, SimRequest
from kvstack.sim.timing import StepCost, step_seconds
from kvstack.sim.tokenizer import NUM_SPECIAL

__all__ = ["ScheduledStep", "Scheduler", "StepOutcome", "StoredBlocks"]

_MASK64 = (1 << 64) - 1


@dataclass(slots=True)
class ScheduledStep:
    start_s: float
    work: list[tuple[SimRequest, int]] = field(default_factory=list)
    cost: StepCost = field(default_factory=StepCost)
    admitted: list[SimRequest] = field(default_factory=list)
    num_preempted: int = 0
    duration_s: float = 0.0

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.work)


@dataclass(frozen=True, slots=True)
class StoredBlocks:
    """Blocks one request added to the prefix cache in one step (one ``BlockStored``)."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    first_block: int
    request: SimRequest


@dataclass(slots=True)
class StepOutcome:
    progressed: list[SimRequest] = field(default_factory=list)
    finished: list[SimRequest] = field(default_factory=list)
    stored: list[StoredBlocks] = field(default_factory=list)
    num_generated: int = 0


class Scheduler:
    def __init__(self, config: SimConfig, pool: BlockPool, loras: LoRASlots, root: BlockHash):
        self.config = config
        self.pool = pool
        self.loras = loras
        self.root = root
        self.block_size = config.block_size
        self.waiting = WaitQueue(config.scheduling_policy)
        self.running: list[SimRequest] = []

    def add(self, req: SimRequest) -> None:
        req.rng_state = (hash(tuple(req.tokens[-8:])) ^ self.config.seed) & _MASK64
        self.waiting.push(req)

    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def next_arrival(self) -> float | None:
        """The earliest arrival among waiting requests (None when none waits)."""
        return min((r.arrival_s for r in self.waiting if not r.aborted), default=None)

    def waiting_adapters(self) -> list[str]:
        return sorted({r.adapter.name for r in self.waiting if r.adapter and not r.aborted})

    def running_adapters(self) -> list[str]:
        return sorted({r.adapter.name for r in self.running if r.adapter})

    # -- scheduling ------------------------------------------------------------------------
    def schedule(self, now_s: float) -> ScheduledStep | None:
        """Plan the next step; None when there is nothing to run."""
        step = ScheduledStep(start_s=now_s)
        budget = self._schedule_running(step, self.config.max_num_batched_tokens)
        if step.num_preempted == 0:
            self._admit_waiting(step, budget, now_s)
        if not step.work:
            return None
        step.duration_s = step_seconds(self.config, step.cost)
        return step

    def _schedule_running(self, step: ScheduledStep, budget: int) -> int:
        for req in list(self.running):
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            if req.aborted:
                self._finish(req, FinishReason.ABORT, step.start_s)
                continue
            num_new = min(req.num_tokens - req.num_computed, budget)
            if num_new <= 0:
                continue
            if not self._grow(req, num_new, step):
                continue
            self._add_work(step, req, num_new)
            budget -= num_new
        return budget

    def _grow(self, req: SimRequest, num_new: int, step: ScheduledStep) -> bool:
        """Give ``req`` the blocks for ``num_new`` more tokens, preempting if needed."""
        need = -(-(req.num_computed + num_new) // self.block_size) - len(req.blocks)
        while need > self.pool.num_free:
            victim = self._victim()
            self._preempt(victim, step)
            if victim is req:
                return False
        if need > 0:
            blocks = self.pool.allocate(need)
            assert blocks is not None
            req.blocks += blocks
        return True

    def _victim(self) -> SimRequest:
        if self.waiting.by_priority:
            return max(self.running, key=lambda r: (r.priority, r.arrival_s))
        return self.running[-1]

    def _preempt(self, req: SimRequest, step: ScheduledStep) -> None:
        for index, (scheduled, num_new) in enumerate(step.work):
            if scheduled is req:  # already planned in this step: take it back out
                del step.work[index]
                self._uncount(step, req, num_new)
                break
        self.running.remove(req)
        self.pool.free(req.blocks)
        req.blocks = []
        req.num_computed = 0
        req.num_cached_blocks = 0
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        step.num_preempted += 1
        self.waiting.push_front(req)

    def _admit_waiting(self, step: ScheduledStep, budget: int, now_s: float) -> None:
        deferred: list[SimRequest] = []
        in_use = set(self.running_adapters())
        while len(self.waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting.pop()
            if req.aborted:
                self._finish(req, FinishReason.ABORT, now_s)
                continue
            if req.arrival_s > now_s:  # catching up on past steps: it had not arrived yet
                deferred.append(req)
                if not self.waiting.by_priority:
                    break  # first come, first served: all later ones arrived later still
                continue
            name = req.adapter.name if req.adapter else None
            if name and name not in in_use and len(in_use) >= self.config.max_loras:
                deferred.append(req)
                continue
            num_new = self._try_admit(req, budget, step)
            if num_new is None:
                self.waiting.push_front(req)
                break
            if name:
                step.cost.lora_s += self.loras.activate(name, in_use)
                in_use.add(name)
            budget -= num_new
        for req in reversed(deferred):
            self.waiting.push_front(req)

    def _try_admit(self, req: SimRequest, budget: int, step: ScheduledStep) -> int | None:
        """Admit ``req`` with its prefix and tier hits; returns its scheduled token count, or
        None (nothing changed) when its blocks do not fit."""
        hits, local, external = self._cached_prefix(req)
        computed = local + external
        num_new = min(req.num_tokens - computed, budget)
        need = -(-(computed + num_new) // self.block_size) - len(hits)
        if need > self.pool.num_free_after_touch(hits):
            return None
        self.pool.touch(hits)
        fresh = self.pool.allocate(need)
        assert fresh is not None
        req.blocks = hits + fresh
        req.num_cached_blocks = len(hits)
        req.num_computed = computed
        if req.num_preemptions == 0:
            req.local_hit_tokens, req.external_hit_tokens = local, external
        req.status = RequestStatus.RUNNING
        if req.scheduled_s is None:
            req.scheduled_s = step.start_s
        self.running.append(req)
        step.admitted.append(req)
        step.cost.transfer_tokens += external
        self._add_work(step, req, num_new)
        return num_new

    def _cached_prefix(self, req: SimRequest) -> tuple[list[KVBlock], int, int]:
        """Prefix-cache blocks hit, their tokens, and the tier tokens beyond them; at most
        ``num_tokens - 1`` tokens are ever reused (the last one must be computed)."""
        self._extend_hashes(req, req.num_tokens)
        bs = self.block_size
        hits: list[KVBlock] = []
        if self.config.enable_prefix_caching:
            hits = self.pool.match_prefix(req.block_hashes[: (req.num_tokens - 1) // bs])
        local = len(hits) * bs
        tier_end = min(req.tier_hit_tokens, req.num_tokens - 1) // bs * bs
        return hits, local, max(0, tier_end - local)

    def _add_work(self, step: ScheduledStep, req: SimRequest, num_new: int) -> None:
        step.work.append((req, num_new))
        if num_new == 1 and req.num_output > 0 and req.num_computed == req.num_tokens - 1:
            step.cost.decode_seqs += 1
            step.cost.decode_context_tokens += req.num_computed
        else:
            step.cost.prefill_tokens += num_new

    def _uncount(self, step: ScheduledStep, req: SimRequest, num_new: int) -> None:
        if num_new == 1 and req.num_output > 0 and req.num_computed == req.num_tokens - 1:
            step.cost.decode_seqs -= 1
            step.cost.decode_context_tokens -= req.num_computed
        else:
            step.cost.prefill_tokens -= num_new

    # -- completion --------------------------------------------------------------------------
    def complete(self, step: ScheduledStep, end_s: float) -> StepOutcome:
        """Apply a step at its end time: computed tokens, sampled tokens, cached blocks."""
        out = StepOutcome()
        for req, num_new in step.work:
            if req.status is not RequestStatus.RUNNING:
                continue
            if req.aborted:
                self._finish(req, FinishReason.ABORT, end_s)
                out.finished.append(req)
                continue
            if req.num_computed < req.num_prompt:
                req.computed_prompt_tokens += min(num_new, req.num_prompt - req.num_computed)
            req.num_computed += num_new
            if self.config.enable_prefix_caching:
                self._cache_full_blocks(req, out)
            if req.num_computed == req.num_tokens:
                self._sample(req, end_s, out)
        return out

    def _sample(self, req: SimRequest, end_s: float, out: StepOutcome) -> None:
        req.rng_state = (req.rng_state * 6364136223846793005 + 1442695040888963407) & _MASK64
        span = self.config.vocab_size - NUM_SPECIAL
        req.tokens.append(NUM_SPECIAL + (req.rng_state >> 33) % span)
        if req.first_token_s is None:
            req.first_token_s = end_s
        req.prev_token_s = req.last_token_s
        req.last_token_s = end_s
        out.num_generated += 1
        out.progressed.append(req)
        if req.num_output >= req.max_tokens:
            self._finish(req, FinishReason.LENGTH, end_s)
            out.finished.append(req)

    def _cache_full_blocks(self, req: SimRequest, out: StepOutcome) -> None:
        num_full = req.num_computed // self.block_size
        if num_full <= req.num_cached_blocks:
            return
        self._extend_hashes(req, num_full * self.block_size)
        first = req.num_cached_blocks
        new_hashes = req.block_hashes[first:num_full]
        for block, block_hash in zip(req.blocks[first:num_full], new_hashes, strict=True):
            self.pool.cache(block, block_hash)
        parent = req.block_hashes[first - 1] if first else None
        tokens = req.tokens[first * self.block_size : num_full * self.block_size]
        out.stored.append(StoredBlocks(new_hashes, parent, tokens, first, req))
        req.num_cached_blocks = num_full

    def _extend_hashes(self, req: SimRequest, num_tokens: int) -> None:
        start = len(req.block_hashes)
        if (num_tokens // self.block_size) <= start:
            return
        parent = req.block_hashes[-1] if start else self.root
        req.block_hashes += chain_block_hashes(
            req.tokens[:num_tokens], self.block_size, parent, start, req.lora, req.cache_salt
        )

    def _finish(self, req: SimRequest, reason: FinishReason, now_s: float) -> None:
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
            self.pool.free(req.blocks)
            req.blocks = []
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.finished_s = now_s
        req.notify()

    def reset_prefix_cache(self) -> bool:
        return not self.running and self.pool.reset()
