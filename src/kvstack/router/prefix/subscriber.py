"""``EventStream``: one ZMQ SUB subscription to one backend's KV events, with gap detection.

Messages are ``(topic, seq, payload)``; ``seq`` counts from 0 per publisher. The stream tells
its sink what it can vouch for:

- ``started(backend, complete)``: the first message; ``complete`` when every batch since the
  publisher started is known (the first seq is 0, or the replay socket filled the rest);
- ``batch(backend, batch)``: the next batch, in order (a sink may raise EventFormatError);
- ``lost(backend, reason)``: batches are missing and the replay socket could not fill them (or
  the publisher restarted): what the sink learnt from events is no longer trustworthy.

Replay (vLLM's and the simulator's ROUTER socket): send ``(b"", start_seq)`` from a DEALER and
read ``(b"", topic, seq, payload)`` until ``seq == END_SEQ``. An endpoint prefixed ``bind+``
is bound instead of connected (vLLM *connects* its PUB socket for a non-wildcard endpoint).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import msgspec
import zmq
import zmq.asyncio

from kvstack.log import IncidentLogger
from kvstack.router.prefix.blocks import EventFormatError
from kvstack.router.prefix.events import END_SEQ, KVEventBatch, decode_batch

__all__ = ["EventSink", "EventStream"]

log = logging.getLogger(__name__)
incidents = IncidentLogger(log)
REPLAY_TIMEOUT_S = 2.0


class EventSink(Protocol):
    def started(self, backend_id: str, complete: bool) -> None: ...

    def batch(self, backend_id: str, batch: KVEventBatch) -> None: ...

    def lost(self, backend_id: str, reason: str) -> None: ...

    def invalid(self, backend_id: str, reason: str) -> None: ...


class EventStream:
    def __init__(
        self,
        backend_id: str,
        endpoint: str,
        sink: EventSink,
        replay_endpoint: str | None = None,
        topic: str = "",
    ) -> None:
        self.backend_id = backend_id
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self._sink = sink
        self._ctx = zmq.asyncio.Context.instance()
        self._next: int | None = None  # the seq expected next
        self.invalid = False
        self.num_batches = 0
        self.num_gaps = 0

    async def run(self) -> None:
        """Receive until cancelled."""
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        sock.setsockopt(zmq.RCVHWM, 100_000)
        try:
            _attach(sock, self.endpoint)
            while True:
                frames = await sock.recv_multipart()
                await self._handle(frames)
        finally:
            sock.close(linger=0)

    async def _handle(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            incidents.warning(
                f"frames:{self.backend_id}",
                "%s: KV event message of %d frames (expected topic, seq, payload)",
                self.backend_id,
                len(frames),
            )
            return
        seq = int.from_bytes(frames[1], "big")
        if self._next is None:
            complete = seq == 0 or await self._replay(0, seq)
            self._next = seq
            self._sink.started(self.backend_id, complete)
        elif seq < self._next:
            if seq != 0:
                return  # already applied (a replay overlapped the live stream)
            self._sink.lost(self.backend_id, "the publisher restarted (seq back to 0)")
            self._sink.started(self.backend_id, True)
        elif seq > self._next:
            self.num_gaps += 1
            gap = f"batches {self._next}..{seq - 1} missing"
            if not await self._replay(self._next, seq):
                self._sink.lost(self.backend_id, gap)
        self._apply(seq, frames[2])

    def _apply(self, seq: int, payload: bytes) -> None:
        self._next = seq + 1
        if self.invalid:
            return
        try:
            batch = decode_batch(payload)
            self._sink.batch(self.backend_id, batch)
        except (msgspec.DecodeError, msgspec.ValidationError, EventFormatError) as exc:
            self.invalid = True
            self._sink.invalid(self.backend_id, str(exc))
            return
        self.num_batches += 1

    async def _replay(self, start: int, stop: int) -> bool:
        """Apply batches ``start .. stop-1`` from the replay socket; True if all came."""
        if self.replay_endpoint is None:
            return False
        sock = self._ctx.socket(zmq.DEALER)
        try:
            sock.connect(self.replay_endpoint)
            await sock.send_multipart((b"", start.to_bytes(8, "big")))
            self._next = start
            while True:
                frames = await asyncio.wait_for(sock.recv_multipart(), REPLAY_TIMEOUT_S)
                if len(frames) != 4 or frames[2] == END_SEQ:
                    break
                seq = int.from_bytes(frames[2], "big")
                if seq == self._next and seq < stop:
                    self._apply(seq, frames[3])
        except TimeoutError:
            log.warning("%s: KV event replay from %s timed out", self.backend_id, self.endpoint)
        finally:
            sock.close(linger=0)
        return self._next == stop


def _attach(sock: zmq.asyncio.Socket, endpoint: str) -> None:
    if endpoint.startswith("bind+"):
        sock.bind(endpoint.removeprefix("bind+"))
    else:
        sock.connect(endpoint)
