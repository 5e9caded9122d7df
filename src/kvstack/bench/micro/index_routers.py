"""Lookups from several routers at once, for ``kvstack bench index --routers 2,4``.

The chart runs 2 to 8 router replicas, each asking the index once per request. One asker (the
single-client figures of :mod:`.index`) leaves out what sets the two backends apart in a fleet:
the index server is one process that hashes every router's prompt itself, while with Valkey each
router hashes its own prompt and Valkey only reads the entries.

Each router here is its own process (as replicas are, and so that no asker waits on another's
interpreter lock) with its own client of every backend, opened from the same URLs as the
single-client arms, asking for the same 128K-token prompt and checking every answer. The
processes start their lookups at one agreed instant, back to back, ``--rounds`` times per
backend, alternating the backends as the single-client arms do. Figures per backend and router
count: p50/p99 of every lookup's wall time, and the lookups per second all routers got
together (lookups over the time from the first start to the last finish).

Back to back, a backend that answers faster is also asked more often, so its p99 is taken at a
higher load than the other's. The paced figures (``paced_*``) ask every backend at one offered
load instead: :data:`PACED_SHARE` of the lookups per second the slowest backend got back to
back, each router asking at Poisson arrival times (the same seeded times for every backend,
offset so that the routers' arrivals interleave), ``lookups // count`` lookups per router. A
lookup's time runs from its arrival time, not from when the router got round to it, so a
router that falls behind counts its waiting (no coordinated omission).
"""

from __future__ import annotations

import multiprocessing
import random
import time
from multiprocessing.connection import Connection
from typing import Any

from kvstack.bench.load.stats import percentile
from kvstack.bench.micro import index_workload
from kvstack.index.backend import open_index
from kvstack.index.client import lookup_request

__all__ = ["measure_routers"]

_START_AHEAD_S = 0.3
PACED_SHARE = 0.7  # the paced load: this share of the slowest backend's back-to-back rate


def _router(urls: dict[str, str], conn: Connection) -> None:
    """One router process: a client per backend; runs what the parent asks until told to stop."""
    request = lookup_request("bench-8b", index_workload.prompt())
    clients = {}
    try:
        for name, url in urls.items():
            clients[name] = open_index(url, 60)
        for client in clients.values():
            index_workload.check(client.lookup(request))
        conn.send("ready")
        while (order := conn.recv()) is not None:
            name, lookups, start_at, arrivals = order
            client = clients[name]
            while time.monotonic() < start_at:
                time.sleep(0.001)
            began, zero = time.monotonic(), time.perf_counter()
            wall = []
            for i in range(lookups):
                start = time.perf_counter()
                if arrivals:  # paced: wait for the arrival; the lookup's time runs from it
                    start = zero + arrivals[i]
                    while (ahead := start - time.perf_counter()) > 0:
                        time.sleep(ahead)
                reply = client.lookup(request)
                wall.append((time.perf_counter() - start) * 1000)
                index_workload.check(reply)
            conn.send((wall, began, time.monotonic()))
    except Exception as exc:  # the parent raises it, with the router's reason
        conn.send(f"{type(exc).__name__}: {exc}")
    finally:
        for client in clients.values():
            client.close()
        conn.close()


class _Fleet:
    """``count`` router processes, each with a pipe to the parent."""

    def __init__(self, urls: dict[str, str], count: int) -> None:
        context = multiprocessing.get_context("spawn")  # no sockets or threads inherited
        self.conns: list[Connection] = []
        self.procs = []
        for _ in range(count):
            parent, child = context.Pipe()
            proc = context.Process(target=_router, args=(urls, child), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        for conn in self.conns:
            answer = conn.recv() if conn.poll(120) else "no answer in 120 s"
            if answer != "ready":
                self.close()
                raise RuntimeError(f"a router process did not start: {answer}")

    def run(
        self, name: str, lookups: int, arrivals: list[list[float]] | None = None
    ) -> tuple[list[float], float]:
        """Every router asks ``lookups`` times at once, back to back or (``arrivals``: each
        router's arrival times, s from the start) paced; all lookups' ms, and the span in s."""
        start_at = time.monotonic() + _START_AHEAD_S
        for i, conn in enumerate(self.conns):
            conn.send((name, lookups, start_at, arrivals[i] if arrivals else None))
        wall: list[float] = []
        began, ended = float("inf"), 0.0
        for conn in self.conns:
            if not conn.poll(600):
                raise RuntimeError(f"a router process gave no answer for {name}")
            answer = conn.recv()
            if isinstance(answer, str):
                raise RuntimeError(f"a router process failed on {name}: {answer}")
            times, start, end = answer
            wall += times
            began, ended = min(began, start), max(ended, end)
        return wall, ended - began

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:  # the process is already gone
                pass
        for proc in self.procs:
            proc.join(30)
            if proc.is_alive():  # pragma: no cover - a process stuck in a lookup
                proc.kill()


def measure_routers(
    urls: dict[str, str], counts: list[int], lookups: int, rounds: int
) -> dict[str, dict[str, Any]]:
    """``{str(count): {backend: figures}}`` for each router count, every backend in ``urls``."""
    out: dict[str, dict[str, Any]] = {}
    for count in counts:
        fleet = _Fleet(urls, count)
        try:
            wall: dict[str, list[float]] = {name: [] for name in urls}
            span: dict[str, float] = dict.fromkeys(urls, 0.0)
            for _ in range(rounds):
                for name in urls:
                    times, seconds = fleet.run(name, max(lookups // rounds, 1))
                    wall[name] += times
                    span[name] += seconds
            offered = PACED_SHARE * min(len(wall[n]) / span[n] for n in urls)
            paced: dict[str, list[float]] = {name: [] for name in urls}
            per_round = max(lookups // count // rounds, 1)
            for r in range(rounds):
                arrivals = _arrivals(count, per_round, offered, seed=r)
                for name in urls:
                    paced[name] += fleet.run(name, per_round, arrivals)[0]
        finally:
            fleet.close()
        out[str(count)] = {
            name: {
                "p50_ms": percentile(wall[name], 50),
                "p99_ms": percentile(wall[name], 99),
                "lookups_per_s": len(wall[name]) / span[name],
                "n": len(wall[name]),
                "paced_per_s": offered,
                "paced_p50_ms": percentile(paced[name], 50),
                "paced_p99_ms": percentile(paced[name], 99),
                "paced_n": len(paced[name]),
            }
            for name in urls
        }
    return out


def _arrivals(count: int, lookups: int, per_s: float, seed: int) -> list[list[float]]:
    """Each of ``count`` routers' ``lookups`` arrival times (s from the start): Poisson, all
    routers together at ``per_s``, each router's first arrival offset by its share of a mean
    gap so that they do not start in step."""
    rng = random.Random(seed)
    gap = count / per_s  # one router's mean gap
    out = []
    for router in range(count):
        t, times = router * gap / count, []
        for _ in range(lookups):
            times.append(t)
            t += rng.expovariate(1 / gap)
        out.append(times)
    return out
