"""Scheduler → worker prefix lookups over ZeroMQ.

vLLM runs the connector's scheduler side and worker side in different processes; the tiers (and
their in-memory CPU tier) live with the worker, next to the KV tensors. Each worker rank serves
``contains_prefix(keys)`` on an IPC socket named after the engine id and rank, answering how
many leading chunks some tier holds and how many of those the in-memory tier holds (the
scheduler loads the latter within the step, the rest asynchronously). The scheduler asks every
rank and takes the shortest hit. A lookup that times out counts as a miss: the request is
computed normally.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec
import zmq

__all__ = ["LookupClient", "LookupServer", "PrefixAnswer", "lookup_endpoint"]

log = logging.getLogger(__name__)
_encode = msgspec.msgpack.Encoder().encode
_decode_keys = msgspec.msgpack.Decoder(list[bytes]).decode
_decode_answer = msgspec.msgpack.Decoder(tuple[int, int]).decode


class PrefixAnswer(NamedTuple):
    chunks: int  # leading chunks held by some tier
    in_memory: int  # leading chunks held by the in-memory tier (<= chunks)


MISS = PrefixAnswer(0, 0)


def lookup_endpoint(engine_id: str, rank: int) -> str:
    return f"ipc://{Path(tempfile.gettempdir()) / f'kvstack-{engine_id[:36]}-{rank}.sock'}"


class LookupServer:
    """A daemon thread answering ``[key, ...] -> (leading keys stored, of those in memory)``."""

    def __init__(
        self, endpoint: str, contains_prefix: Callable[[Sequence[bytes]], PrefixAnswer]
    ) -> None:
        self.endpoint = endpoint
        self._contains_prefix = contains_prefix
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kvstack-lookup", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            request = self._sock.recv()
            try:
                found = self._contains_prefix(_decode_keys(request))
            except Exception:  # a broken lookup is a miss, never a dead server
                log.exception("kvstack lookup failed")
                found = MISS
            self._sock.send(_encode(tuple(found)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()
        if self.endpoint.startswith("ipc://"):
            Path(self.endpoint[len("ipc://") :]).unlink(missing_ok=True)


class LookupClient:
    """Asks each rank's server; on a timeout the socket is rebuilt and the answer is 0."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float) -> None:
        self._endpoints = list(endpoints)
        self._timeout_ms = int(timeout_s * 1000)
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socks = [self._connect(e) for e in self._endpoints]

    def _connect(self, endpoint: str) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, self._timeout_ms)
        sock.setsockopt(zmq.SNDTIMEO, self._timeout_ms)
        sock.connect(endpoint)
        return sock

    def prefix(self, keys_by_rank: Sequence[Sequence[bytes]]) -> PrefixAnswer:
        """Leading chunks stored on every rank, and of those in memory (a miss on failure)."""
        found: PrefixAnswer | None = None
        for rank, keys in enumerate(keys_by_rank):
            try:
                self._socks[rank].send(_encode(list(keys)))
                answer = PrefixAnswer(*_decode_answer(self._socks[rank].recv()))
            except zmq.ZMQError as exc:
                log.warning("kvstack lookup on rank %d failed (%s); treating as a miss", rank, exc)
                self._socks[rank].close()
                self._socks[rank] = self._connect(self._endpoints[rank])
                return MISS
            if found is None:
                found = answer
            else:
                found = PrefixAnswer(min(found[0], answer[0]), min(found[1], answer[1]))
        return found or MISS

    def close(self) -> None:
        for sock in self._socks:
            sock.close()
