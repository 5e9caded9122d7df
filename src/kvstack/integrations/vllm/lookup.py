"""Scheduler → worker prefix lookups over ZeroMQ, without stalling the scheduler.

vLLM runs the connector's scheduler side and worker side in different processes; the tiers (and
their in-memory CPU tier) live with the worker, next to the KV tensors. Each worker rank serves
``contains_prefix(keys)`` on an IPC socket named after the engine id and rank, answering how
many leading chunks some tier holds and how many of those the in-memory tier holds (the
scheduler loads the latter within the step, the rest asynchronously). The scheduler asks every
rank and takes the shortest hit.

A lookup may be slow: the worker's answer can wait on a remote tier (Redis, S3, a peer) or on a
busy core. vLLM's scheduler calls the connector inline, so a lookup it waited for would hold
every running request's next step. Instead :meth:`LookupClient.start` sends the question and
:meth:`LookupClient.poll` waits only briefly (:data:`POLL_WAIT_S`) for the answer; without one
the connector tells vLLM the hit is not known yet, and vLLM asks again in its next step while
the others keep stepping. A lookup unanswered after ``timeout_s`` counts as a miss: the request
is computed normally.

The sockets live in a directory only the engine's user may enter (``<tmp>/kvstack-<uid>``,
mode 0700, checked at every start), and each socket file is made owner-only once bound: another
local user can neither ask a worker about its prompts nor plant a socket the scheduler would ask.
A worker killed without its shutdown leaves its socket file behind; the next server to start
removes those nobody listens on any more (:func:`sweep_stale_sockets`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import msgspec
import zmq

from kvstack.errors import ConfigError

__all__ = [
    "POLL_WAIT_S",
    "LookupClient",
    "LookupServer",
    "PrefixAnswer",
    "lookup_endpoint",
    "sweep_stale_sockets",
]

log = logging.getLogger(__name__)
_encode = msgspec.msgpack.Encoder().encode
_decode_question = msgspec.msgpack.Decoder(tuple[int, list[bytes]]).decode
_decode_answer = msgspec.msgpack.Decoder(tuple[int, int, int]).decode
# How long one scheduler call waits for an answer before deferring the request a step: a lookup
# answered from memory or a local disk takes well under a millisecond plus the IPC round trip.
POLL_WAIT_S = 0.002
# libzmq drops (and disconnects) anything larger before allocating it. A question is its
# prompt's chunk keys, ~34 bytes each: 4 MiB is 2M tokens at 16-token chunks. An answer is
# three integers.
MAX_QUESTION_BYTES = 4 * 1024 * 1024
MAX_ANSWER_BYTES = 1024


class PrefixAnswer(NamedTuple):
    chunks: int  # leading chunks held by some tier
    in_memory: int  # leading chunks held by the in-memory tier (<= chunks)


MISS = PrefixAnswer(0, 0)


def socket_dir() -> Path:
    """``<tmp>/kvstack-<uid>``, created mode 0700; refused unless this user owns it, alone."""
    path = Path(tempfile.gettempdir()) / f"kvstack-{os.getuid()}"
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ConfigError(
            f"the connector's lookup socket directory {path} must be a directory owned by uid "
            f"{os.getuid()} with mode 0700 (it is uid {info.st_uid}, mode "
            f"{stat.filemode(info.st_mode)}); remove it or fix its owner and mode"
        )
    return path


# A socket file younger than this is left alone: its server may be between bind and listen.
STALE_AFTER_S = 60.0


def sweep_stale_sockets(directory: Path, now: float | None = None) -> int:
    """Remove the ``*.sock`` files in ``directory`` that refuse a connection (nobody listens:
    their engine died without closing) and are older than :data:`STALE_AFTER_S`; how many.
    A file that accepts, or cannot be checked, is kept."""
    now = time.time() if now is None else now
    removed = 0
    for path in directory.glob("*.sock"):
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        if not stat.S_ISSOCK(info.st_mode) or now - info.st_mtime < STALE_AFTER_S:
            continue
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
        except OSError:
            pass  # not ours to judge (too long a path, a permission): keep it
        finally:
            probe.close()
    if removed:
        log.info("removed %d stale lookup socket(s) from %s", removed, directory)
    return removed


def lookup_endpoint(engine_id: str, rank: int) -> str:
    return f"ipc://{socket_dir() / f'{engine_id[:36]}-{rank}.sock'}"


class LookupServer:
    """A daemon thread answering ``[key, ...] -> (leading keys stored, of those in memory)``."""

    def __init__(
        self, endpoint: str, contains_prefix: Callable[[Sequence[bytes]], PrefixAnswer]
    ) -> None:
        self.endpoint = endpoint
        self._path = Path(endpoint[len("ipc://") :]) if endpoint.startswith("ipc://") else None
        self._contains_prefix = contains_prefix
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_QUESTION_BYTES)
        if self._path is not None:
            sweep_stale_sockets(self._path.parent)
        self._sock.bind(endpoint)
        if self._path is not None:
            self._path.chmod(0o600)
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
            lookup_id, found = -1, MISS
            try:
                lookup_id, keys = _decode_question(request)
                found = self._contains_prefix(keys)
            except Exception:  # a broken lookup is a miss, never a dead server
                log.exception("kvstack lookup failed")
            self._sock.send(_encode((lookup_id, *found)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)


@dataclass
class _Pending:
    deadline: float
    answers: dict[int, PrefixAnswer] = field(default_factory=dict)  # by rank


class LookupClient:
    """Asks each rank's server; any number of lookups may be outstanding (one DEALER socket
    per rank, answers matched by lookup id). Not thread-safe: the scheduler's thread owns it."""

    def __init__(self, endpoints: Sequence[str], timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socks = [self._connect(e) for e in endpoints]
        self._poller = zmq.Poller()
        for sock in self._socks:
            self._poller.register(sock, zmq.POLLIN)
        self._ids = itertools.count()
        self._pending: dict[int, _Pending] = {}

    def _connect(self, endpoint: str) -> zmq.Socket[bytes]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_ANSWER_BYTES)
        sock.connect(endpoint)
        return sock

    def start(self, keys_by_rank: Sequence[Sequence[bytes]]) -> int:
        """Send a lookup to every rank; its id for :meth:`poll`."""
        lookup_id = next(self._ids)
        self._pending[lookup_id] = _Pending(time.monotonic() + self._timeout_s)
        for sock, keys in zip(self._socks, keys_by_rank, strict=True):
            try:  # a DEALER talking to a REP socket sends the empty delimiter frame itself
                sock.send_multipart([b"", _encode((lookup_id, list(keys)))], zmq.NOBLOCK)
            except zmq.ZMQError as exc:  # the worker is gone or far behind: a miss
                log.warning("kvstack lookup could not be sent (%s); treating as a miss", exc)
                self._pending[lookup_id].deadline = 0.0
        return lookup_id

    def poll(self, lookup_id: int, wait_s: float = POLL_WAIT_S) -> PrefixAnswer | None:
        """The leading chunks stored on every rank, and of those in memory; None while some rank
        has not answered yet (waiting at most ``wait_s``); a miss once the lookup timed out."""
        pending = self._pending.get(lookup_id)
        if pending is None:
            return MISS
        until = min(time.monotonic() + wait_s, pending.deadline)
        while len(pending.answers) < len(self._socks):
            self._receive(max(0.0, until - time.monotonic()))
            if time.monotonic() >= until:
                break
        if len(pending.answers) == len(self._socks):
            self._pending.pop(lookup_id, None)
            return PrefixAnswer(
                min(a.chunks for a in pending.answers.values()),
                min(a.in_memory for a in pending.answers.values()),
            )
        if time.monotonic() >= pending.deadline:
            self._pending.pop(lookup_id, None)
            log.warning(
                "kvstack lookup unanswered after %.1f s; treating as a miss", self._timeout_s
            )
            return MISS
        return None

    def cancel(self, lookup_id: int) -> None:
        """Forget a lookup (its request went away); a late answer is dropped."""
        self._pending.pop(lookup_id, None)

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    def _receive(self, wait_s: float) -> None:
        """Take every answer that arrives within ``wait_s`` (at least those already here)."""
        events = dict(self._poller.poll(int(wait_s * 1000)))
        for rank, sock in enumerate(self._socks):
            if sock not in events:
                continue
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    lookup_id, chunks, in_memory = _decode_answer(frames[-1])
                except (msgspec.DecodeError, IndexError):
                    log.warning("kvstack lookup: an unreadable answer from rank %d", rank)
                    continue
                pending = self._pending.get(lookup_id)
                if pending is not None:  # else cancelled or timed out: dropped
                    pending.answers[rank] = PrefixAnswer(chunks, in_memory)
        self._expire()

    def _expire(self) -> None:
        """Drop lookups past their deadline by a second whose requests stopped asking."""
        now = time.monotonic()
        for lookup_id in [i for i, p in self._pending.items() if now > p.deadline + 1.0]:
            del self._pending[lookup_id]

    def close(self) -> None:
        for sock in self._socks:
            sock.close()
