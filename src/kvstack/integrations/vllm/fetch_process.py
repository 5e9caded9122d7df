"""Asynchronous loads fetched in a helper process (``load_fetch=process``, vLLM's CPU build).

A load thread of the worker shares the interpreter lock with the engine's step: every time it
comes back from a read it waits for the lock, and taking it stops the step (``kvstack bench
fetch``, and :mod:`.loads`). :class:`FetchProcess` moves the tier reads of deferred loads
(those fetched whole before the next step writes them) to a child process with its own
interpreter:

- the staging buffers are one anonymous shared-memory file (``memfd``) of ``slots`` chunks,
  mapped by both processes; a deferred load borrows slots, not private buffers;
- the worker sends ``(job, keys, slots)`` over a socket pair and polls the replies once per
  step (:meth:`poll`): no thread of the worker waits for the helper;
- the helper opens the worker's shared tiers (disk, Redis, S3; not ``cpu://``, whose memory
  is the worker's, nor ``peer://``) read-only, checks chunk MACs with the same cluster keys,
  and reads each job's chunks into its slots; the worker fills the leading chunks its own
  ``cpu://`` tier holds before it sends the rest;
- nothing secret travels in ``argv`` or the environment: the helper is given two descriptor
  numbers, and the tier URLs and the security section (secret file paths, not secrets) come
  over the socket;
- the helper's tier counters come back with every reply, so the connector's metrics count its
  reads as the worker's own would be.

A chunk fetched by the helper is not promoted into the worker's ``cpu://`` tier: the copy
would cost the step what the helper saves it (vLLM's prefix cache holds the blocks once
written). A job that times out keeps its slots lent until the helper answers for it. If the
helper dies, or hangs (it takes no job for :data:`SEND_TIMEOUT_S`; it is then killed), its
pending loads are reported failed (vLLM recomputes them) and later loads fetch on the worker's
threads again; the log says so once. The helper exits when the worker's end of
the socket closes, whatever the way the worker ended.

Framing: a 4-byte big-endian length and a msgpack body (msgspec), at most :data:`MAX_FRAME`
bytes, checked before anything is allocated.
"""

from __future__ import annotations

import concurrent.futures
import logging
import mmap
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import torch

from kvstack.errors import ConfigError

__all__ = ["MAX_FRAME", "FetchProcess", "Reply", "helper_tiers"]

log = logging.getLogger(__name__)
MAX_FRAME = 4 << 20  # bytes of one message, either way (a job's keys, a reply's counters)
START_TIMEOUT_S = 120.0  # the helper imports torch and opens the tiers
SEND_TIMEOUT_S = 5.0  # a helper that takes no job for this long is hung: it is killed
_LENGTH = struct.Struct("!I")
_NOT_IN_HELPER = ("cpu", "peer")  # the worker's own memory; peers need the cluster's locator


class Job(msgspec.Struct, frozen=True):
    job: int
    keys: list[bytes]
    slots: list[int]


class Reply(msgspec.Struct, frozen=True):
    job: int
    loaded: int  # leading chunks of the job read whole into their slots
    tiers: dict[str, dict[str, float]]  # the helper's tier counters so far, by tier name


class Start(msgspec.Struct, frozen=True):
    kv: dict[str, Any]
    security: dict[str, Any]
    tiers: list[tuple[str, str]]  # (name, url)
    shape: list[int]
    slots: int
    threads: int
    counters: list[str]


def helper_tiers(urls: Sequence[str]) -> list[tuple[str, str]]:
    """The (name, url) of the tiers a helper process can read: not ``cpu://`` or ``peer://``;
    named as the worker's cache names them."""
    from kvstack.kv.chain import tier_names
    from kvstack.kv.tiers import parse_tier_url

    return [
        (name, url)
        for url, name in zip(urls, tier_names(urls), strict=True)
        if parse_tier_url(url).scheme not in _NOT_IN_HELPER
    ]


class _Frames:
    """Length-prefixed msgpack frames from a byte stream, each bounded by MAX_FRAME."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while len(self._buf) >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(self._buf)
            if size > MAX_FRAME:
                raise ValueError(f"a fetch helper frame of {size} bytes (at most {MAX_FRAME})")
            if len(self._buf) < _LENGTH.size + size:
                break
            out.append(bytes(self._buf[_LENGTH.size : _LENGTH.size + size]))
            del self._buf[: _LENGTH.size + size]
        return out


def _send(sock: socket.socket, obj: object) -> None:
    body = msgspec.msgpack.encode(obj)
    if len(body) > MAX_FRAME:
        raise ValueError(f"a fetch helper frame of {len(body)} bytes (at most {MAX_FRAME})")
    sock.sendall(_LENGTH.pack(len(body)) + body)


def _slab(fd: int, slots: int, shape: Sequence[int]) -> tuple[mmap.mmap, torch.Tensor]:
    size = slots * int(torch.Size(shape).numel())
    mapped = mmap.mmap(fd, size)
    return mapped, torch.frombuffer(mapped, dtype=torch.uint8).view(slots, *shape)


class FetchProcess:
    """The worker's end: the helper process, its shared slots and its replies."""

    def __init__(
        self,
        kv: Any,  # KVConfig
        security: Any,  # SecurityConfig
        tiers: list[tuple[str, str]],
        shape: tuple[int, int, int],
        slots: int,
        threads: int,
        counters: Sequence[str],
    ) -> None:
        if not tiers:
            raise ConfigError("load_fetch=process needs a tier other than cpu:// or peer://")
        self.slots = slots
        self._memfd = os.memfd_create("kvstack-fetch", os.MFD_CLOEXEC)
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            os.ftruncate(self._memfd, slots * int(torch.Size(shape).numel()))
            self._map, self.slab = _slab(self._memfd, slots, shape)
            self._sock, child = socket.socketpair()
            # A deadline on every send (reads wait in select, and only for what is there).
            self._sock.settimeout(SEND_TIMEOUT_S)
            try:
                # Descriptor numbers only in argv: the tier URLs come over the socket.
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", __name__, str(child.fileno()), str(self._memfd)],
                    pass_fds=(child.fileno(), self._memfd),
                    stdin=subprocess.DEVNULL,
                )
            finally:
                child.close()
            start = Start(
                kv.model_dump(mode="json"),
                security.model_dump(mode="json"),
                tiers,
                list(shape),
                slots,
                threads,
                list(counters),
            )
            _send(self._sock, start)
            self._frames = _Frames()
            ready = self._recv_one(START_TIMEOUT_S)
        except BaseException:
            self._kill()
            raise
        if ready.get("error"):
            self._kill()
            raise ConfigError(f"the fetch helper process could not start: {ready['error']}")
        self.pid = self._proc.pid
        self.alive = True
        self._free = list(range(slots))
        self._free_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._totals: dict[str, float] = {}
        self._deltas: dict[str, float] = {}
        log.info("kvstack connector: loads fetch in helper process %d from tiers %s, "
                 "%d chunk slots", self.pid, [n for n, _ in tiers], slots)  # fmt: skip

    def _recv_one(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._sock], [], [], remaining)[0]:
                raise TimeoutError(f"the fetch helper process said nothing for {timeout_s:g} s")
            data = self._sock.recv(1 << 16)
            if not data:
                raise ConfigError("the fetch helper process exited at start (its log says why)")
            frames = self._frames.feed(data)
            if frames:
                answer: dict[str, Any] = msgspec.msgpack.decode(frames[0])
                return answer

    # -- slots -----------------------------------------------------------------------------
    def lend(self, count: int) -> list[int] | None:
        with self._free_lock:
            if count == 0 or count > len(self._free):
                return None
            taken, self._free = self._free[-count:], self._free[:-count]
            return taken

    def give_back(self, slots: Sequence[int]) -> None:
        with self._free_lock:
            self._free += slots

    @property
    def lent_slots(self) -> int:
        with self._free_lock:
            return self.slots - len(self._free)

    def views(self, slots: Sequence[int]) -> list[torch.Tensor]:
        return [self.slab[s] for s in slots]

    # -- jobs ------------------------------------------------------------------------------
    def submit(self, job: int, keys: Sequence[bytes], slots: Sequence[int]) -> bool:
        """Send a job; False where the helper is gone (the caller fetches it itself)."""
        if not self.alive:
            return False
        try:
            with self._send_lock:
                _send(self._sock, Job(job, list(keys), list(slots)))
        except OSError as exc:
            self._died(f"sending a job failed: {exc}")
            return False
        return True

    def poll(self, timeout_s: float = 0.0) -> list[Reply]:
        """The replies that arrived, waiting at most ``timeout_s`` for the first."""
        if not self.alive:
            return []
        replies: list[Reply] = []
        wait = timeout_s
        while select.select([self._sock], [], [], wait)[0]:
            wait = 0.0
            try:
                data = self._sock.recv(1 << 16)
                if not data:
                    self._died("it exited")
                    break
                frames = self._frames.feed(data)
                replies += [msgspec.msgpack.decode(f, type=Reply) for f in frames]
            except (OSError, ValueError, msgspec.DecodeError) as exc:
                self._died(f"its answer could not be read: {exc}")
                break
        for reply in replies:
            self._count(reply.tiers)
        return replies

    def _count(self, tiers: dict[str, dict[str, float]]) -> None:
        for tier, counters in tiers.items():
            for counter, value in counters.items():
                name = f"tier:{tier}:{counter}"
                delta = value - self._totals.get(name, 0.0)
                self._totals[name] = value
                if delta > 0:
                    self._deltas[name] = self._deltas.get(name, 0.0) + delta

    def take_tier_counts(self) -> dict[str, float]:
        """The helper's tier counter increments since the last call (``tier:name:counter``)."""
        deltas, self._deltas = self._deltas, {}
        return deltas

    def _died(self, why: str) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()  # a hung helper must not write into slots lent out again later
        if self.alive:
            self.alive = False
            log.error("kvstack connector: the fetch helper process %d is gone (%s); its pending "
                      "loads are recomputed and later ones fetch on the worker's threads",
                      self.pid, why)  # fmt: skip

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)

    def close(self) -> None:
        self.alive = False
        try:
            self._sock.close()  # the helper sees the end of its input and exits
            if self._proc is not None:
                try:
                    self._proc.wait(5)
                except subprocess.TimeoutExpired:
                    self._kill()
        finally:
            os.close(self._memfd)


# -- the helper process ----------------------------------------------------------------------
def _helper(sock: socket.socket, memfd: int) -> None:
    from kvstack.kv.cache import KVCache
    from kvstack.kv.config import KVConfig
    from kvstack.kv.keys import ChunkKey
    from kvstack.kv.tiers import make_tier
    from kvstack.security import SecurityConfig, load_keys

    frames = _Frames()
    pending: list[bytes] = []

    def next_frame() -> bytes | None:
        while not pending:
            data = sock.recv(1 << 16)
            if not data:
                return None
            pending.extend(frames.feed(data))
        return pending.pop(0)

    torch.set_num_threads(1)  # its copies are small; the engine's cores are the engine's
    first = next_frame()
    if first is None:
        return
    start = msgspec.msgpack.decode(first, type=Start)
    try:
        security = SecurityConfig.model_validate(start.security)
        # Read-only: the worker writes, promotes and evicts; here nothing is put anywhere.
        kv = KVConfig.model_validate({**start.kv, "write_tiers": None, "promote_on_hit": False})
        tiers = [make_tier(url, name=name) for name, url in start.tiers]
        cache = KVCache(kv, tiers=tiers, keys=load_keys(security))
        for tier in cache.tiers:
            tier.trust = cache.trust  # the cluster's MAC key and read bound, as in the worker
        _, slab = _slab(memfd, start.slots, start.shape)
    except Exception as exc:  # said to the worker, which logs it and fetches on its threads
        _send(sock, {"error": f"{type(exc).__name__}: {exc}"})
        return
    _send(sock, {"ready": True})
    send_lock = threading.Lock()

    def fetch(job: Job) -> None:
        loaded = 0
        try:
            bad = [s for s in job.slots if not 0 <= s < start.slots]
            if bad or len(job.slots) != len(job.keys):
                raise ValueError(f"job {job.job}: slots out of range or not one per key")
            keys = [ChunkKey(k) for k in job.keys]
            loaded = cache.get_chunks_into(keys, [slab[s] for s in job.slots])
        except Exception:
            log.exception("kvstack fetch helper: job %d failed", job.job)
        with send_lock:
            counts = {
                t.name: {c: float(getattr(t.stats(), c)) for c in start.counters}
                for t in cache.tiers
            }
            _send(sock, Reply(job.job, loaded, counts))

    pool = concurrent.futures.ThreadPoolExecutor(start.threads, "kvstack-fetch")
    try:
        while (frame := next_frame()) is not None:
            pool.submit(fetch, msgspec.msgpack.decode(frame, type=Job))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        cache.close(timeout_s=1.0)


def main(argv: Sequence[str]) -> None:
    logging.basicConfig(
        level=logging.WARNING, format="kvstack fetch helper %(process)d: %(levelname)s %(message)s"
    )
    sock = socket.socket(fileno=int(argv[0]))
    try:
        _helper(sock, int(argv[1]))
    except (OSError, ValueError, msgspec.DecodeError) as exc:
        log.error("stopping: %s", exc)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # a fetch still reading does not hold the exit up


if __name__ == "__main__":
    main(sys.argv[1:])
