"""``kvstack bench fetch``: a file-tier fetch beside a step that holds the interpreter lock.

Inside vLLM's worker an asynchronous load (:mod:`kvstack.integrations.vllm.loads`) fetches on
threads of the worker's own process, so it shares the interpreter lock with the engine's step.
Each time a loader thread comes back from a system call (an ``open``, a ``readinto``) it needs
the lock again, and while the step runs Python it waits for the step's next release or for the
interpreter's switch interval (5 ms). The fetch is then as slow as the step is busy, and a load
off the step ends later than the same load on the step, where the step waits with the lock
released. This benchmark measures that on its own, without an engine, and measures the
alternative: the same tier in a helper process that reads into shared memory.

Arms, in rotating order within each round, each for ``--seconds``:

- ``none``: the step loop alone (the reference for the step's p99);
- ``thread-4``: the file tier's ``get_many_into`` on a loader thread, ``readers=4`` (the
  tier's default, as the worker's asynchronous loads use it);
- ``thread-1``: the same with ``readers=1``;
- ``process``: the same tier (``readers=4``) in a helper process, reading into a shared-memory
  buffer. The step polls its pipe once per step, as a worker would check its loads; no thread
  of the step's process waits on it.

``--tier redis`` reads the chunks from a throw-away ``redis-server`` on loopback instead, with
two arms beside the step alone: ``thread`` (the Redis tier's batched get on a loader thread)
and ``process`` (the same in the helper).

The step: ``--python-ms`` of pure interpreter work, then ``--compute-ms`` of a torch matrix
product on one thread (it releases the lock, as an engine's kernels do). The step's process is
bound to the first CPU it may use and the fetches (threads or the helper) to the others, as
kvstack's background threads are beside vLLM's CPU build. A fetch reads ``--chunks`` chunks of
``--chunk-mib`` MiB that are in the page cache (so the time is the interpreter's and memory's,
not the disk's; ``--cold`` drops them from it before every fetch, so each is a disk read),
then the next starts ``--gap-ms`` after the step saw it done. A fetch's time is
taken from its start to the end of the first step that sees it done, the moment a worker
would report it to vLLM; every fetch is checked to have returned every chunk.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing
import multiprocessing.connection
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvstack.bench.load.stats import percentile
from kvstack.bench.micro.kv import positive_int
from kvstack.bench.micro.shared_tiers import spread
from kvstack.bench.results import save
from kvstack.kv.keys import KEY_BYTES, ChunkKey
from kvstack.kv.tiers import make_tier

__all__ = ["run", "tier_arms"]

PAGE_BYTES = 4096
LAYERS = 16


def run(argv: list[str]) -> int:
    started = time.time()
    args = _parser().parse_args(argv)
    chunks = args.chunks or (8 if args.quick else 32)
    # The arms rotate: with the file tier's four, 4 (8) rounds put each in every position once
    # (twice).
    rounds = args.rounds or (4 if args.quick else 8)
    seconds = args.seconds or (0.6 if args.quick else 3.0)
    python_ms = [float(x) for x in args.python_ms.split(",")]
    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    if args.cold and args.tier != "file":
        raise SystemExit("kvstack bench fetch: --cold applies to the file tier only")
    root = Path(tempfile.mkdtemp(prefix="kvstack-bench-fetch-", dir=args.dir))
    try:
        with contextlib.ExitStack() as stack:
            split = _split_cpus()
            port = None
            if args.tier == "redis":
                from kvstack.bench.micro.shared_tiers import redis_server

                # The server starts on the fetches' CPUs (it inherits them), off the step's: it
                # stands for a Redis on another host.
                stack.enter_context(_bound_to(split[1]))
                port = stack.enter_context(redis_server(root, {}))
            cpus = stack.enter_context(_bound_step(split))
            result = measure(
                tier_arms(args.tier, root, port), chunks, args.chunk_mib, rounds, seconds,
                python_ms, args.compute_ms, args.gap_ms, set(cpus["fetch"] or ()),
                root if args.cold else None,
            )  # fmt: skip
            result["cpus"] = cpus
            result["tier"] = args.tier
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["args"] = vars(args)
    from kvstack.bench.micro.fetch_step_report import markdown

    print(markdown(result))
    save("fetch", argv, result, args.json, started=started)
    return 0


def tier_arms(tier: str, root: Path, port: int | None) -> dict[str, tuple[str, str]]:
    """The fetching arms of ``tier``: name -> (``thread`` or ``process``, tier URL)."""
    if tier == "file":
        base = f"file://{root.resolve()}?size=1TiB"
        return {
            "thread-4": ("thread", f"{base}&readers=4"),
            "thread-1": ("thread", f"{base}&readers=1"),
            "process": ("process", f"{base}&readers=4"),
        }
    url = f"redis://127.0.0.1:{port}"
    return {"thread": ("thread", url), "process": ("process", url)}


def _split_cpus() -> tuple[set[int], set[int]]:
    """(the step's CPU, the fetches' CPUs): the first this process may use, and the others (the
    same one where there is only one)."""
    if not hasattr(os, "sched_getaffinity"):
        return set(), set()
    cpus = sorted(os.sched_getaffinity(0))
    return {cpus[0]}, set(cpus[1:]) or {cpus[0]}


@contextmanager
def _bound_to(cpus: set[int]) -> Any:
    if not cpus:  # no affinity calls here
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextmanager
def _bound_step(split: tuple[set[int], set[int]]) -> Any:
    """Bind this process to the step's CPU (``split``: :func:`_split_cpus`), on one torch
    thread, for the run; yields the CPUs of the step and of the fetches."""
    step, rest = split
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with _bound_to(step):
            yield {"step": sorted(step) or None, "fetch": sorted(rest) or None}
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Window:
    steps: list[float] = field(default_factory=list)
    fetch_seen: list[float] = field(default_factory=list)  # start to the step that saw it done
    fetch_own: list[float] = field(default_factory=list)  # as the fetcher timed itself


def measure(
    arms: dict[str, tuple[str, str]],
    chunks: int,
    chunk_mib: int,
    rounds: int,
    seconds: float,
    python_ms: list[float],
    compute_ms: float,
    gap_ms: float,
    fetch_cpus: set[int],
    cold: Path | None = None,
) -> dict[str, Any]:
    """Every arm (:func:`tier_arms`) at every step load, beside the step alone; ``fetch_cpus``:
    where the fetches run (the step runs wherever the caller bound it; none bound where empty);
    ``cold``: the file tier's directory, dropped from the page cache before every fetch."""
    shape = (LAYERS, chunk_mib * (1 << 20) // (LAYERS * PAGE_BYTES), PAGE_BYTES)
    keys = [ChunkKey(i.to_bytes(4, "big") * (KEY_BYTES // 4)) for i in range(chunks)]
    _fill(next(iter(arms.values()))[1], keys, shape)
    fetchers: dict[str, _Fetcher] = {}
    compute = _calibrate(compute_ms)
    drop = None
    if cold is not None:
        from kvstack.bench.micro.vllm_harness import evict_page_cache

        # Evict only: counting what stayed resident (a `fincore` process) each fetch would
        # spend the step's CPU on a figure nothing reads.
        drop = functools.partial(evict_page_cache, cold)
    out: dict[str, Any] = {
        "chunks": chunks,
        "chunk_bytes": shape[0] * shape[1] * shape[2],
        "rounds": rounds,
        "seconds": seconds,
        "compute_ms": compute_ms,
        "gap_ms": gap_ms,
        "cold": cold is not None,
        "switch_interval_ms": 1000 * sys.getswitchinterval(),
        "loads": [],
    }
    names = ("none", *arms)
    try:
        for arm, (kind, url) in arms.items():
            fetchers[arm] = (_Helper if kind == "process" else _ThreadFetcher)(
                url, keys, shape, fetch_cpus
            )
        for py in python_ms:
            step = _step_fn(py / 1000, compute)
            windows: dict[str, list[_Window]] = {arm: [] for arm in names}
            gap = gap_ms / 1000
            for r in range(rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for arm in order:
                    fetcher = fetchers.get(arm)
                    _window(step, fetcher, min(0.3, seconds), gap, drop)  # warm-up
                    windows[arm].append(_window(step, fetcher, seconds, gap, drop))
            out["loads"].append({"python_ms": py, "arms": _summary(windows)})
        out["ran_on"] = {arm: f.ran_on for arm, f in fetchers.items()}
    finally:
        for f in fetchers.values():
            f.close()
    return out


def _fill(url: str, keys: list[ChunkKey], shape: tuple[int, int, int]) -> None:
    tier = make_tier(url)
    gen = torch.Generator().manual_seed(0)
    for key in keys:
        tier.put(key, torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen))
    if not tier.flush(60):
        raise RuntimeError("the tier did not write the benchmark's chunks within 60 s")
    tier.close()


def _calibrate(compute_ms: float) -> Callable[[], None]:
    """A torch op (it releases the interpreter lock) taking about ``compute_ms``."""
    a = torch.randn(128, 128)
    reps = 200
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, a)
    per = (time.perf_counter() - t0) / reps
    n = max(1, round(compute_ms / 1000 / per))

    def compute() -> None:
        for _ in range(n):
            torch.mm(a, a)

    return compute


def _step_fn(python_s: float, compute: Callable[[], None]) -> Callable[[], None]:
    def step() -> None:
        start = time.perf_counter()
        x = 0
        while time.perf_counter() - start < python_s:  # the step's Python: holds the lock
            for i in range(100):
                x += i
        compute()

    return step


class _Fetcher:
    ran_on: list[int]  # the CPUs the fetch may use

    def start(self) -> None: ...
    def done(self) -> float | None:  # the fetcher's own seconds once done, else None
        ...
    def close(self) -> None: ...


class _ThreadFetcher(_Fetcher):
    def __init__(
        self, url: str, keys: list[ChunkKey], shape: tuple[int, int, int], cpus: set[int]
    ) -> None:
        self._tier, self._keys = make_tier(url), keys
        self._bufs = [torch.empty(shape, dtype=torch.uint8) for _ in keys]
        self._pool = ThreadPoolExecutor(1, "bench-fetch", initializer=_bind, initargs=(cpus,))
        self._job: Future[float] | None = None
        self.ran_on = []

    def _fetch(self) -> float:
        if hasattr(os, "sched_getaffinity"):
            self.ran_on = sorted(os.sched_getaffinity(0))
        t0 = time.perf_counter()
        got = self._tier.get_many_into(self._keys, self._bufs)
        if not all(got):
            raise RuntimeError(f"a fetch returned {sum(got)} of {len(got)} chunks")
        return time.perf_counter() - t0

    def start(self) -> None:
        self._job = self._pool.submit(self._fetch)

    def done(self) -> float | None:
        if self._job is None or not self._job.done():
            return None
        own, self._job = self._job.result(), None
        return own

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._tier.close()


def _bind(cpus: set[int]) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    if cpus and hasattr(os, "sched_getaffinity") and os.sched_getaffinity(0) != cpus:
        raise RuntimeError(f"a fetch could not be bound to CPUs {sorted(cpus)}")


class _Helper(_Fetcher):
    """The tier in a helper process: it reads into a shared-memory buffer on request."""

    def __init__(
        self, url: str, keys: list[ChunkKey], shape: tuple[int, int, int], cpus: set[int]
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._shm = torch.empty((len(keys), *shape), dtype=torch.uint8)
        self._shm.share_memory_()  # type: ignore[no-untyped-call]
        self._conn, child = ctx.Pipe()
        interval = sys.getswitchinterval()
        self._proc = ctx.Process(
            target=_helper_main,
            args=(child, url, [bytes(k) for k in keys], self._shm, cpus, interval),
            daemon=True,
        )
        self._proc.start()
        child.close()
        if not self._conn.poll(120):
            raise RuntimeError("the fetch helper process did not start within 120 s")
        self.ran_on = self._conn.recv()
        self._busy = False

    def start(self) -> None:
        self._conn.send(True)
        self._busy = True

    def done(self) -> float | None:
        if not self._busy or not self._conn.poll():
            return None
        self._busy = False
        got, own = self._conn.recv()
        if got != len(self._shm):
            raise RuntimeError(f"the helper's fetch returned {got} of {len(self._shm)} chunks")
        return float(own)

    def close(self) -> None:
        try:
            self._conn.send(False)
        except OSError:
            pass
        self._proc.join(30)
        if self._proc.is_alive():
            self._proc.kill()


def _helper_main(
    conn: multiprocessing.connection.Connection,
    url: str,
    keys: list[bytes],
    shm: torch.Tensor,
    cpus: set[int],
    switch_interval: float,
) -> None:
    sys.setswitchinterval(switch_interval)
    _bind(cpus)
    tier = make_tier(url)
    chunk_keys = [ChunkKey(k) for k in keys]
    outs = list(shm)
    conn.send(sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [])
    while conn.recv():
        t0 = time.perf_counter()
        got = tier.get_many_into(chunk_keys, outs)
        conn.send((sum(got), time.perf_counter() - t0))
    tier.close()


def _window(
    step: Callable[[], None],
    fetcher: _Fetcher | None,
    seconds: float,
    gap_s: float,
    before_fetch: Callable[[], object] | None = None,
) -> _Window:
    w = _Window()
    started: float | None = None
    next_at = time.perf_counter()
    end = next_at + seconds
    while (now := time.perf_counter()) < end or started is not None:
        if fetcher is not None and started is None and now >= next_at and now < end:
            if before_fetch is not None:
                before_fetch()  # between steps, before the fetch's clock starts
            fetcher.start()
            started = time.perf_counter()
        t0 = time.perf_counter()
        step()
        if fetcher is not None and started is not None:
            own = fetcher.done()  # the step's end: where a worker reports finished loads
            if own is not None:
                seen = time.perf_counter()
                w.fetch_seen.append(seen - started)
                w.fetch_own.append(own)
                started, next_at = None, seen + gap_s
        if now < end:
            w.steps.append(time.perf_counter() - t0)
    return w


def _p99(xs: list[float]) -> float:
    p = percentile(xs, 99)
    assert p is not None  # every window times steps
    return p


def _summary(windows: dict[str, list[_Window]]) -> dict[str, Any]:
    quiet = [_p99(w.steps) for w in windows["none"]]
    out: dict[str, Any] = {}
    for arm, ws in windows.items():
        p99s = [_p99(w.steps) for w in ws]
        row: dict[str, Any] = {
            "steps": sum(len(w.steps) for w in ws),
            "step_p50_ms": spread([1000 * statistics.median(w.steps) for w in ws]),
            "step_p99_ms": spread([1000 * p for p in p99s]),
            "step_p99_ratio": spread([p / q for p, q in zip(p99s, quiet, strict=True)]),
        }
        if arm != "none":
            row["fetches"] = sum(len(w.fetch_seen) for w in ws)
            row["fetch_seen_ms"] = spread(
                [1000 * statistics.median(w.fetch_seen) for w in ws if w.fetch_seen]
            )
            row["fetch_own_ms"] = spread(
                [1000 * statistics.median(w.fetch_own) for w in ws if w.fetch_own]
            )
        out[arm] = row
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack bench fetch", description=__doc__.split("\n\n")[1])
    p.add_argument("--json", metavar="FILE", help="the result file (default: bench-results/fetch/)")
    p.add_argument("--quick", action="store_true", help="fewer chunks, rounds and seconds")
    p.add_argument("--dir", help="directory for the file tier (default: the system temp dir)")
    p.add_argument(
        "--tier",
        choices=("file", "redis"),
        default="file",
        help="where the chunks are: the file tier (default) or a redis-server on loopback",
    )
    p.add_argument("--chunks", type=positive_int, help="chunks per fetch (default 32)")
    p.add_argument("--chunk-mib", type=positive_int, default=3, help="MiB per chunk (default 3)")
    p.add_argument(
        "--rounds", type=positive_int, help="rounds; each runs every arm once (default 8)"
    )
    p.add_argument("--seconds", type=float, help="seconds per arm and round (default 3)")
    p.add_argument(
        "--python-ms",
        default="1,4",
        help="the step's interpreter work in ms, one load per value (default 1,4)",
    )
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        help="the interpreter's switch interval in the step's process and the helper (default: "
        "Python's, 5 ms)",
    )
    p.add_argument("--compute-ms", type=float, default=1.0, help="the step's torch work in ms")
    p.add_argument(
        "--cold",
        action="store_true",
        help="drop the chunk files from the page cache before every fetch (a disk read)",
    )
    p.add_argument("--gap-ms", type=float, default=20.0, help="pause between fetches in ms")
    return p
