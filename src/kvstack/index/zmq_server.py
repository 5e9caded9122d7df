"""The index operations over ZMQ: a ROUTER socket served on the HTTP app's event loop.

Started by the app's lifespan when ``index.service.zmq_port`` is set; framing in
:mod:`kvstack.index.wire`. Requests are answered one at a time on the loop that also runs the
HTTP routes and the maintenance task, so the index state is never touched from two threads.
Counted in the same metrics as HTTP (``kvstack_index_requests_total`` by operation and status,
``kvstack_index_lookup_seconds``). An invalid request is answered 400 with the reason; nothing a
client sends stops the loop.

With the cluster's keys every request must carry a valid auth frame (:mod:`kvstack.index.auth`):
an unsigned, forged, stale or replayed one is answered 401 with the reason and never reaches an
operation. libzmq drops messages above ``max_body_bytes`` (``ZMQ_MAXMSGSIZE``, which closes the
sender's connection) before anything is allocated for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec
import zmq
import zmq.asyncio

from kvstack.index.auth import FrameChecker
from kvstack.index.operations import REFUSED, Operation, Refusal, count_request, refused
from kvstack.index.urls import tcp_address
from kvstack.index.wire import (
    BAD_REQUEST,
    FAILED,
    OK,
    UNAUTHORIZED,
    error_frames,
    split_request,
)

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = ["ZmqServer"]

log = logging.getLogger(__name__)


class ZmqServer:
    def __init__(
        self,
        operations: Mapping[str, Operation],
        host: str,
        port: int,
        keys: ClusterKeys | None = None,
        max_frame_bytes: int = 32 << 20,
    ) -> None:
        self.endpoint = tcp_address(host, port)
        self._operations = operations
        self._checker = None if keys is None else FrameChecker(keys)
        self._sock = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        # the whole message, frames together: the body plus small id, operation and auth frames
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes + 4096)
        self._sock.setsockopt(zmq.IPV6, int(":" in host))
        self._sock.bind(self.endpoint)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> ZmqServer:
        """Serve on the running loop until :meth:`aclose`."""
        self._task = asyncio.create_task(self._serve())
        log.info("index server answers ZMQ on %s", self.endpoint)
        return self

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._sock.close()

    async def _serve(self) -> None:
        while True:
            identity, *frames = await self._sock.recv_multipart()
            await self._sock.send_multipart([identity, *self.answer(frames)])

    def answer(self, frames: list[bytes]) -> list[bytes]:
        """Reply frames ``[request_id, status, body]`` to request frames; never raises."""
        try:
            request_id, name, body, auth = split_request(frames)
        except ValueError as exc:
            refused("invalid")
            return error_frames(frames[0] if frames else b"", BAD_REQUEST, str(exc))
        if self._checker is not None:
            problem = self._checker.refusal(request_id, name.encode(), body, auth)
            if problem is not None:
                refused("auth")
                count_request(name, "401")
                return error_frames(request_id, UNAUTHORIZED, problem)
        operation = self._operations.get(name)
        if operation is None:
            known = ", ".join(self._operations)
            problem = f"unknown operation {name!r}; expected one of {known}"
            return error_frames(request_id, BAD_REQUEST, problem)
        try:
            result = operation.answer(msgspec.msgpack.decode(body, type=operation.kind))
            reply = msgspec.msgpack.encode(result)
        except Refusal as exc:
            refused(exc.reason)
            count_request(name, str(exc.status))
            return error_frames(request_id, str(exc.status).encode(), str(exc))
        except REFUSED as exc:
            refused("invalid")
            count_request(name, "400")
            return error_frames(request_id, BAD_REQUEST, f"invalid {name} request: {exc}")
        except Exception as exc:  # a request boundary: one failed answer, never a dead loop
            log.exception("index: %s request over ZMQ failed", name)
            count_request(name, "500")
            return error_frames(request_id, FAILED, f"{name} failed: {exc!r}")
        count_request(name, "200")
        return [request_id, OK, reply]
