"""Saves: the copy-out of newly computed full chunks is the only save work near the step.

Per step, for the chunks the scheduler planned (:class:`SaveQueue`):

1. ``begin`` (at the step's first ``save_kv_layer`` or at ``wait_for_save``): a target for each
   chunk — memory inside the first tier (``prepare_put``: one copy, no staging; none when the
   tier already holds the chunk or does not admit it), or a staging buffer (on GPUs, pinned,
   and for first tiers without two-phase puts);
2. ``layer(i)`` (layer pipelining): copy layer ``i``'s pages of those chunks on the copy stream
   as soon as the layer has run (on GPUs into device memory, :class:`.transfers.LayerCopyOut`);
3. ``end`` (``wait_for_save``): copy the layers not copied yet (on GPUs: and send each chunk
   over the link in one transfer); the copy-out's completion goes with the batch. In ``step``
   mode the step waits for it; in ``background`` mode it does not, and the blocks of a request
   that finishes meanwhile stay allocated until ``copy_pending`` says the copy is over (vLLM's
   delayed block freeing, see the scheduler side).

The save thread then does everything else, off the step: it waits for the copy-out, publishes
the chunk (``complete_put``: the first tier writes through to the slower ones in their own
background writers; or a prefix check and ``put_chunks`` of a staging buffer), and counts it.
Hashing happened on the scheduler side; checksums, MACs and compression happen in the tiers.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvstack.integrations.plan import ChunkIO, RequestIO
from kvstack.integrations.vllm.layout import PagedKV
from kvstack.integrations.vllm.streams import DONE, Completion, CopyStream
from kvstack.integrations.vllm.transfers import LayerCopyOut
from kvstack.kv.affinity import starting_background_threads
from kvstack.kv.cache import KVCache
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tiers.base import Tier

__all__ = ["MAX_STAGED_CHUNKS", "SaveCounts", "SaveQueue"]

# Called on the step for each chunk about to be copied out (KV events remember its tokens).
OnSave = Callable[[ChunkKey, ChunkIO, "str | None"], None]

log = logging.getLogger(__name__)
# Staging buffers in flight, at most (fewer where the connector's staging_mib holds fewer); the
# step waits for the save thread beyond.
MAX_STAGED_CHUNKS = 256


@dataclass
class SaveCounts:
    chunks: int = 0
    bytes: int = 0
    generated_chunks: int = 0
    skipped_chunks: int = 0


@dataclass
class _Item:
    key: ChunkKey
    index: torch.Tensor
    target: torch.Tensor
    direct: bool  # target is first-tier memory from prepare_put
    generated: bool


@dataclass
class _Batch:
    step: int
    req_ids: set[str]
    items: list[_Item] = field(default_factory=list)
    copied_layers: set[int] = field(default_factory=set)
    copied: Completion = DONE
    copy_out: LayerCopyOut | None = None  # None: nothing to copy


class SaveQueue:
    def __init__(
        self,
        cache: KVCache,
        chunk_shape: tuple[int, int, int],
        rank: int,
        stream: CopyStream,
        wait_on_step: bool,
        on_save: OnSave | None = None,
        max_staged: int = MAX_STAGED_CHUNKS,
    ) -> None:
        self._cache, self._shape, self._rank = cache, chunk_shape, rank
        self._stream, self._wait_on_step, self._on_save = stream, wait_on_step, on_save
        self._two_phase = _first_write_tier_two_phase(cache)
        self._batch: _Batch | None = None
        self._copies: deque[_Batch] = deque()  # copy-outs that may still be running
        self._staging = _StagingPool(chunk_shape, torch.cuda.is_available(), max_staged)
        self._counts = SaveCounts()
        self._counts_lock = threading.Lock()
        self._queue: queue.Queue[_Batch | None] = queue.Queue()
        self._queued_items = 0  # chunks in batches put on the queue, not yet published
        with starting_background_threads():
            self._thread = threading.Thread(target=self._publish_loop, name="kvstack-save")
            self._thread.daemon = True
            self._thread.start()

    # -- on the step -----------------------------------------------------------------------
    def layer(self, paged: PagedKV, step: int, saves: list[RequestIO], layer: int) -> None:
        batch = self._begin(paged, step, saves)
        if (
            batch.copy_out is not None
            and not batch.copy_out.defers_layers
            and layer not in batch.copied_layers
        ):
            batch.copied_layers.add(layer)
            copy_out = batch.copy_out
            batch.copied = self._stream.submit(lambda: copy_out.layer(layer))

    def end(self, paged: PagedKV, step: int, saves: list[RequestIO]) -> None:
        batch = self._begin(paged, step, saves)
        self._batch = None
        if not batch.items:
            return
        rest = [i for i in range(paged.layout.num_layers) if i not in batch.copied_layers]
        copy_out = batch.copy_out
        if copy_out is not None and (rest or copy_out.on_device):
            batch.copied = self._stream.submit(lambda: copy_out.end(rest))
        if self._wait_on_step:
            batch.copied.wait()
        else:
            self._copies.append(batch)
        with self._counts_lock:
            self._queued_items += len(batch.items)
        self._queue.put(batch)

    def _begin(self, paged: PagedKV, step: int, saves: list[RequestIO]) -> _Batch:
        if self._batch is not None and self._batch.step == step:
            return self._batch
        batch = _Batch(step, {r.req_id for r in saves})
        direct = self._two_phase and paged.device.type == "cpu"
        for request in saves:
            for chunk in request.chunks:
                # Not direct, every item so far holds a staging buffer.
                item = self._target(paged, chunk, request.lora_name, direct, len(batch.items))
                if item is not None:
                    batch.items.append(item)
        if batch.items:
            indexes, targets = [i.index for i in batch.items], [i.target for i in batch.items]
            batch.copy_out = LayerCopyOut(paged, indexes, targets)
        self._batch = batch
        return batch

    def _target(
        self, paged: PagedKV, chunk: ChunkIO, lora_name: str | None, direct: bool, staged: int
    ) -> _Item | None:
        """``staged``: the staging buffers the batch holds already."""
        key = ChunkKey(chunk.keys[self._rank])
        if direct:
            target = self._cache.prepare_put(key, torch.uint8, self._shape)
            if target is None:  # held already, being stored, or not admitted
                self._count(skipped_chunks=1)
                return None
        else:
            target = self._staging.acquire(staged)
        if self._on_save is not None:
            self._on_save(key, chunk, lora_name)
        return _Item(key, paged.block_index(chunk.block_ids), target, direct, chunk.generated)

    def copy_pending(self, req_id: str) -> bool:
        """Whether a copy-out of ``req_id``'s blocks may still be running."""
        self._poll()
        return any(req_id in batch.req_ids for batch in self._copies)

    def wait_copies(self, req_ids: set[str]) -> None:
        """Block until the copy-outs of these requests' blocks are over (preemption)."""
        for batch in list(self._copies):
            if batch.req_ids & req_ids:
                _wait_quietly(batch.copied)
        self._poll()

    def copied_through(self, step: int) -> int:
        """The last step all of whose copy-outs are over."""
        self._poll()
        return self._copies[0].step - 1 if self._copies else step

    def _poll(self) -> None:
        while self._copies and self._copies[0].copied.done():
            self._copies.popleft()

    # -- on the save thread ----------------------------------------------------------------
    def _publish_loop(self) -> None:
        while (batch := self._queue.get()) is not None:
            ok = _wait_quietly(batch.copied)
            for item in batch.items:
                try:
                    self._publish(item, ok)
                except Exception:  # a failing save is a future miss, never a dead thread
                    log.exception("kvstack: saving a chunk failed")
                finally:
                    if not item.direct:
                        self._staging.release(item.target)
                    with self._counts_lock:
                        self._queued_items -= 1
            self._queue.task_done()

    def _publish(self, item: _Item, copied: bool) -> None:
        if item.direct:
            stored = self._cache.complete_put(item.key, copied)
        elif not copied or self._cache.contains_prefix([item.key]):
            stored = False
        elif self._two_phase:  # staged from a GPU: one host copy into the first tier's memory
            target = self._cache.prepare_put(item.key, torch.uint8, self._shape)
            if target is not None:
                target.copy_(item.target)
            stored = target is not None and self._cache.complete_put(item.key, True)
        else:
            stored = bool(self._cache.put_chunks([item.key], [item.target]))
        if stored:
            self._count(chunks=1, bytes=item.target.numel(), generated_chunks=int(item.generated))
        else:
            self._count(skipped_chunks=1)

    def _count(self, **deltas: int) -> None:
        with self._counts_lock:
            for name, value in deltas.items():
                setattr(self._counts, name, getattr(self._counts, name) + value)

    def take_counts(self) -> SaveCounts:
        with self._counts_lock:
            counts, self._counts = self._counts, SaveCounts()
        return counts

    @property
    def staging_buffers(self) -> int:
        """Staging buffers allocated, free or holding a chunk for the save thread."""
        return self._staging.allocated

    def queued_chunks(self) -> int:
        """Chunks copied out (or being copied) and not yet handed to the tiers."""
        with self._counts_lock:
            return self._queued_items

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued batch is published."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.001)
        return not self._queue.unfinished_tasks

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)


def _wait_quietly(done: Completion) -> bool:
    try:
        return done.wait()
    except Exception:  # the copy raised on its stream: the chunk is not published
        log.exception("kvstack: a copy-out failed")
        return False


def _first_write_tier_two_phase(cache: KVCache) -> bool:
    """Whether the first tier that receives stores offers its memory (``prepare_put``)."""
    names = cache.config.write_tiers
    tier = next((t for t in cache.tiers if names is None or t.name in names), None)
    return tier is not None and type(tier).prepare_put is not Tier.prepare_put


class _StagingPool:
    """At most ``most`` staging buffers. A step waits for the save thread to give one back,
    except where the step's own batch holds every buffer there is (its batch is queued only
    once it has them all, so nothing would come back): then it takes one more, which is let
    go, not kept, when it comes back."""

    def __init__(self, shape: tuple[int, int, int], pin: bool, most: int) -> None:
        self._shape, self._pin, self._most = shape, pin, most
        self._free: list[torch.Tensor] = []
        self._count = 0  # buffers allocated and not let go, free or held
        self._cond = threading.Condition()

    def acquire(self, held_by_caller: int = 0) -> torch.Tensor:
        with self._cond:
            while not self._free and self._count >= self._most and self._count > held_by_caller:
                self._cond.wait()
            if self._free:
                return self._free.pop()
            self._count += 1
        return torch.empty(self._shape, dtype=torch.uint8, pin_memory=self._pin)

    def release(self, buffer: torch.Tensor) -> None:
        with self._cond:
            if self._count > self._most:
                self._count -= 1  # one taken beyond the limit: let go
            else:
                self._free.append(buffer)
            self._cond.notify()

    @property
    def allocated(self) -> int:
        with self._cond:
            return self._count
