"""``ReplicaSync``: router replicas tell each other what they routed, over Valkey pub/sub.

Each replica knows alone what it sent where: the requests in flight on each engine (the load
view counts them before the engine's metrics do) and the prompts on their way into an engine's
cache (the radix tree's routed and in-flight owners, until KV events confirm them). With
several replicas behind one Service, each sees a fraction of that, so two replicas send the
same new prefix to two engines and pile bursts on one engine. With ``router.prefix.share_url``
set, every replica publishes each dispatch (engine, prompt namespace and tokens, pending
prefill), first token and finish on one channel, and applies the other replicas' messages to
its own load counters and radix tree exactly as it applies its own dispatches; a replica that
goes away has its entries dropped after ``share_timeout_s``.

Messages are small msgpack arrays (tokens as uint32 bytes); publishing never blocks a request
(a queue drained by one task), and a Valkey that is down costs only the sharing, logged once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from kvstack.index.radix import Owner, RadixNamespace
from kvstack.index.radix_node import Node
from kvstack.log import IncidentLogger
from kvstack.metrics import counter
from kvstack.router.fleet.backends import BackendPool, BackendView
from kvstack.router.fleet.load import LoadLease
from kvstack.router.prefix.state import PrefixState
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.config import PrefixConfig

__all__ = ["ReplicaSync"]

log = logging.getLogger(__name__)
SHARED = counter(
    "kvstack_router_replica_messages_total", "Soft state shared between router replicas",
    ["direction"],
)  # fmt: skip
DISPATCH, FIRST_TOKEN, FINISH = 0, 1, 2
_ENCODE = msgspec.msgpack.Encoder()
_DECODE = msgspec.msgpack.Decoder(list[Any])


@dataclass
class _Remote:
    """Another replica's request, as this replica counts it."""

    lease: LoadLease
    owner: Owner
    lock: Node | None
    since: float


class ReplicaSync:
    def __init__(self, config: PrefixConfig, prefix: PrefixState, pool: BackendPool) -> None:
        if not config.share_url:
            raise ValueError("ReplicaSync needs router.prefix.share_url")
        self.config = config
        self.prefix = prefix
        self.pool = pool
        self.replica = uuid.uuid4().hex[:12]
        self._channel = config.share_channel.encode()
        self._outbox: asyncio.Queue[bytes] = asyncio.Queue(maxsize=10_000)
        self._sequence: dict[tuple[int, str], int] = {}  # (id(request), backend) -> sequence
        self._next = 0
        self._remote: dict[tuple[str, int], _Remote] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._client: Any = None
        self._incidents = IncidentLogger(log)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        from kvstack.index.valkey.connect import connect_async
        from kvstack.index.valkey.url import parse_valkey_url

        self._client = connect_async(parse_valkey_url(self.config.share_url or "", 2.0))
        self._tasks = [asyncio.create_task(job()) for job in (self._send, self._receive,
                                                               self._expire)]  # fmt: skip

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- RequestObserver: tell the others --------------------------------------------------
    def on_dispatch(self, request: RoutingRequest, backend: BackendView) -> None:
        prompt = request.state.prompt
        if prompt is None:
            return
        self._next += 1
        self._sequence[(id(request), backend.id)] = self._next
        ns = prompt.namespace
        tokens = np.asarray(prompt.tokens, dtype="<u4").tobytes()
        self._post([DISPATCH, self.replica, self._next, backend.id, ns.model, ns.adapter, ns.salt,
                    tokens, prompt.exact, request.prefill_tokens(backend.id)])  # fmt: skip

    def on_first_token(self, request: RoutingRequest, backend: BackendView, ttft_s: float) -> None:
        sequence = self._sequence.get((id(request), backend.id))
        if sequence is not None:
            self._post([FIRST_TOKEN, self.replica, sequence])

    def on_finish(self, request: RoutingRequest, backend: BackendView, outcome: str) -> None:
        sequence = self._sequence.pop((id(request), backend.id), None)
        if sequence is not None:
            self._post([FINISH, self.replica, sequence])

    def _post(self, message: list[Any]) -> None:
        try:
            self._outbox.put_nowait(_ENCODE.encode(message))
        except asyncio.QueueFull:
            self._incidents.warning("queue", "replica sync: outbox full; messages dropped")

    async def _send(self) -> None:
        while True:
            batch = [await self._outbox.get()]
            while not self._outbox.empty() and len(batch) < 256:
                batch.append(self._outbox.get_nowait())
            try:
                pipe = self._client.pipeline(transaction=False)
                for payload in batch:
                    pipe.publish(self._channel, payload)
                await pipe.execute()
                SHARED.labels("sent").inc(len(batch))
            except Exception as exc:  # Valkey down: this replica routes on what it knows
                self._incidents.warning("send", "replica sync: cannot publish (%s)", exc)

    # -- the others' requests --------------------------------------------------------------
    async def _receive(self) -> None:
        while True:
            try:
                pubsub = self._client.pubsub(ignore_subscribe_messages=True)
                await pubsub.subscribe(self._channel)
                async for item in pubsub.listen():
                    self.apply(_DECODE.decode(item["data"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # reconnect: what we missed is dropped by the expiry
                self._incidents.warning("receive", "replica sync: subscription lost (%s)", exc)
                await asyncio.sleep(1.0)

    def apply(self, message: list[Any]) -> None:
        """Count another replica's dispatch, first token or finish as if it were ours."""
        kind, replica, sequence = message[:3]
        if replica == self.replica:
            return
        SHARED.labels("applied").inc()
        key = (replica, sequence)
        if kind == DISPATCH:
            self._dispatched(key, *message[3:])
        elif kind == FIRST_TOKEN and key in self._remote:
            self._remote[key].lease.first_token()
        elif kind == FINISH and key in self._remote:
            self._drop(key)

    def _dispatched(
        self, key: tuple[str, int], backend_id: str, model: str, adapter: str, salt: str,
        tokens: bytes, exact: bool, prefill_tokens: int,
    ) -> None:  # fmt: skip
        backend = self.pool.get(backend_id)
        if backend is None:
            return
        precise = exact and self.prefix.is_precise(backend_id)
        owner = Owner(backend_id, "inflight" if precise else "routed")
        ids = np.frombuffer(tokens, dtype="<u4").tolist()
        done = self.prefix.index.insert(RadixNamespace(model, adapter, salt), ids, owner, lock=True)
        lease = backend.load.acquire(int(prefill_tokens))
        self._remote[key] = _Remote(lease, owner, done.lock, time.monotonic())

    def _drop(self, key: tuple[str, int]) -> None:
        remote = self._remote.pop(key)
        remote.lease.release()
        if remote.lock is not None:
            self.prefix.index.unlock(remote.lock, remote.owner)

    async def _expire(self) -> None:
        """Drop other replicas' requests not finished within ``share_timeout_s`` (a replica
        that died, a finish message lost while Valkey was away)."""
        while True:
            await asyncio.sleep(min(5.0, self.config.share_timeout_s))
            cutoff = time.monotonic() - self.config.share_timeout_s
            for key in [k for k, r in self._remote.items() if r.since < cutoff]:
                self._drop(key)
