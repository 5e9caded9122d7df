"""``kvstack bench index [--entries 1000000] [--lookups 3000] [--rounds 5] [--routers 2,4]
[--json FILE]``

Both cluster KV index backends in one run, with the same fleet (8 engines with CPU and disk
tiers, one shared Redis store: :mod:`.index_workload`) and the same 128K-token prompt (512
chunks of 256 tokens), ``--entries`` chunks indexed in each:

- ``in_process``: :meth:`IndexState.lookup` — key hashing plus the index walk, no I/O;
- ``service_zmq``, ``service_http``: ``kvstack index-server`` in its own process, asked by
  :class:`IndexClient` over its ZMQ endpoint and over HTTP (msgpack, tokens as uint32 bytes);
  ``service_http_json``: the same over JSON with a token list (the friendly form);
- ``valkey``: the ``valkey`` backend on one ``redis-server`` (``ValkeyIndex``: the client
  hashes the prompt, writing each 128 keys' ``MGET`` as they are hashed, one round trip);
  ``valkey_one_trip``: the same index asked with ``send_ahead=0`` (all keys hashed, then one
  pipelined trip: the reference for sending ahead); ``valkey_cluster``: on a 3-master Redis
  Cluster (16 buckets).

Lookups run in ``--rounds`` rounds in which the arms take turns every 10 lookups, so that noise
from other work on the machine falls on every arm alike. 3,000 lookups per arm by default: with
300, each round's p99 was its largest sample or nearly, and on the 2-core reference machine the
rounds' Valkey/ZMQ p99 ratios ranged 0.77x to 1.69x in one run; with 3,000 they ranged 0.82x to
1.03x. Each figure has wall-clock p50/p99
and, beside it, the asking thread's CPU time (``cpu_*``) and the server process's CPU per
lookup (``server_cpu_ms``).
Announce throughput (events per second) is measured for each backend in bulk (65,536-key
reports, a full sync) and steady (512-event reports of stores and removals). Every lookup
answer is checked; the bar: the Valkey backend's p99 <= the index server's over ZMQ, and <= 5 ms.

``--routers 2,4`` (the default) then measures lookups from that many routers asking at once,
each its own process (:mod:`.index_routers`): the chart runs 2 to 8 router replicas. They ask
back to back, and then paced, every backend at the same offered load.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec

from kvstack.bench import results
from kvstack.bench.load.stats import percentile
from kvstack.bench.micro import index_routers, index_servers, index_workload
from kvstack.bench.micro.index_workload import NUM_INSTANCES, PROMPT_TOKENS, check
from kvstack.index.backend import IndexBackend, open_index
from kvstack.index.client import lookup_request
from kvstack.index.protocol import AnnounceBatch, EventReply, LookupReply
from kvstack.index.state import IndexState
from kvstack.index.urls import zmq_url

__all__ = ["run"]

BAR_MS = 5.0
BLOCK = 10  # lookups an arm asks in a row before the next arm's turn
STEADY_EVENTS = 102_400
Lookup = Callable[[], LookupReply]


class Arm:
    """One way of asking the index, with the server processes whose CPU it costs."""

    def __init__(self, name: str, lookup: Lookup, pids: list[int]) -> None:
        self.name, self.lookup, self.pids = name, lookup, pids
        self.wall_ms: list[float] = []
        self.cpu_ms: list[float] = []
        self.round_p99_ms: list[float] = []
        self.server_cpu_s = 0.0
        self._round_start = 0

    def check(self) -> None:
        """One untimed lookup, its answer checked."""
        check(self.lookup())

    def block(self, lookups: int) -> None:
        """``lookups`` timed lookups in a row, and the servers' CPU they cost."""
        server_before = sum(map(index_servers.process_cpu_s, self.pids))
        for _ in range(lookups):
            start, start_cpu = time.perf_counter(), time.thread_time()
            self.lookup()
            self.wall_ms.append((time.perf_counter() - start) * 1000)
            self.cpu_ms.append((time.thread_time() - start_cpu) * 1000)
        self.server_cpu_s += sum(map(index_servers.process_cpu_s, self.pids)) - server_before

    def end_round(self) -> None:
        self.round_p99_ms.append(_p(self.wall_ms[self._round_start :], 99))
        self._round_start = len(self.wall_ms)

    def measure(self, lookups: int) -> None:
        """One round of ``lookups`` on its own."""
        self.check()
        self.block(lookups)
        self.end_round()

    def figures(self) -> dict[str, Any]:
        n = len(self.wall_ms)
        return {
            "p50_ms": _p(self.wall_ms, 50), "p99_ms": _p(self.wall_ms, 99),
            "cpu_p50_ms": _p(self.cpu_ms, 50), "cpu_p99_ms": _p(self.cpu_ms, 99),
            "server_cpu_ms": 1000 * self.server_cpu_s / n if self.pids else None,
            "round_p99_ms": [round(v, 3) for v in self.round_p99_ms], "n": n,
        }  # fmt: skip


def _p(samples: list[float], q: float) -> float:
    value = percentile(samples, q)
    if value is None:
        raise ValueError("no lookup was timed")
    return value


def announce(report: Callable[[AnnounceBatch], EventReply], entries: int, pids: list[int]
             ) -> dict[str, float]:  # fmt: skip
    """Feed the fleet (bulk) and a steady stream; events per second of each, and CPU."""
    epochs: dict[str, str] = {}
    figures: dict[str, float] = {}
    for kind, batches in (
        ("bulk", index_workload.bulk_batches(entries)),
        ("steady", index_workload.steady_batches(STEADY_EVENTS, seed=3)),
    ):
        server_before = sum(map(index_servers.process_cpu_s, pids))
        start, start_cpu = time.perf_counter(), time.process_time()
        events = index_workload.feed(report, batches, epochs)
        wall_s = time.perf_counter() - start
        figures[f"{kind}_events_per_s"] = events / wall_s
        figures[f"{kind}_client_cpu_us_per_event"] = (
            1e6 * (time.process_time() - start_cpu) / events
        )
        server_s = sum(map(index_servers.process_cpu_s, pids)) - server_before
        figures[f"{kind}_server_cpu_us_per_event"] = 1e6 * server_s / events
    return figures  # fmt: skip


def _json_lookup(http: httpx.Client) -> Lookup:
    tokens = index_workload.prompt().tolist()

    def lookup() -> LookupReply:
        body = http.post("/lookup", json={"model": "bench-8b", "tokens": tokens}).json()
        return msgspec.convert(body, LookupReply)

    return lookup


def _valkey_memory_mb(ports: list[int]) -> float:
    """Memory the index takes in Valkey: ``used_memory`` summed over the primaries."""
    import redis

    used = 0.0
    for port in ports:
        with redis.Redis(port=port) as raw:
            used += float(raw.info("memory")["used_memory"])
    return used / 2**20


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    request = lookup_request("bench-8b", index_workload.prompt())
    state = IndexState()
    index_workload.feed(state.apply, index_workload.bulk_batches(args.entries), {})
    arms = [Arm("in_process", lambda: state.lookup(request), [])]
    result: dict[str, Any] = {"entries": len(state.index), "announce": {}, "memory_mb": {}}
    with contextlib.ExitStack() as stack:
        service, port, zmq_port = stack.enter_context(index_servers.index_server())
        valkey_ports: dict[str, list[int]] = {}
        urls = {"service_zmq": zmq_url("127.0.0.1", zmq_port)}
        clients: dict[str, tuple[IndexBackend, list[int]]] = {
            "service_zmq": (open_index(urls["service_zmq"], 60), [service.pid]),
            "service_http": (open_index(f"http://127.0.0.1:{port}", 60), [service.pid]),
        }
        for name, opener in (("valkey", index_servers.redis_server),
                             ("valkey_cluster", index_servers.redis_cluster)):  # fmt: skip
            if name == "valkey_cluster" and args.no_cluster:
                continue
            procs, url, ports = stack.enter_context(opener())
            joiner = "&" if "?" in url else "?"
            urls[name] = f"{url}{joiner}prefix=bench:&instance_ttl_s=3600"  # as the server's
            clients[name] = (open_index(urls[name], 60), [p.pid for p in procs])
            valkey_ports[name] = ports
            if name == "valkey":  # the same index, each lookup in one pipelined trip
                one_trip = open_index(f"{urls[name]}&send_ahead=0", 60)
                clients["valkey_one_trip"] = (one_trip, [p.pid for p in procs])
        for client, _ in clients.values():
            stack.callback(client.close)
        _announce_all(clients, args.entries, result)
        result["memory_mb"]["service"] = _rss_mb(service.pid)
        for name, ports in valkey_ports.items():
            result["memory_mb"][name] = _valkey_memory_mb(ports)
        for name, (client, pids) in clients.items():
            arms.append(Arm(name, lambda c=client: c.lookup(request), pids))  # type: ignore[misc]
        _interleave(arms, args.rounds, max(args.lookups // args.rounds, 1))
        http = stack.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60))
        json_arm = Arm("service_http_json", _json_lookup(http), [service.pid])
        json_arm.measure(max(args.lookups // 10, 10))
        arms.append(json_arm)
        if args.routers:
            result["routers"] = index_routers.measure_routers(
                urls, args.routers, args.lookups, args.rounds
            )
    result["lookup_128k"] = {arm.name: arm.figures() for arm in arms}
    return result


def _interleave(arms: list[Arm], rounds: int, per_round: int) -> None:
    """``rounds`` rounds of ``per_round`` lookups per arm, the arms taking turns every
    :data:`BLOCK` lookups, so that a burst of noise from elsewhere on the machine (a second
    or two) falls on every arm alike."""
    for _ in range(rounds):
        for arm in arms:
            arm.check()
        done = 0
        while done < per_round:
            count = min(BLOCK, per_round - done)
            for arm in arms:
                arm.block(count)
            done += count
        for arm in arms:
            arm.end_round()


def _announce_all(
    clients: dict[str, tuple[IndexBackend, list[int]]], entries: int, result: dict[str, Any]
) -> None:
    for name, (client, pids) in clients.items():
        if name in ("service_http", "valkey_one_trip"):
            continue  # the same index: fed once, by the faster of its two ways of asking
        backend = "service" if name.startswith("service") else name
        result["announce"][backend] = announce(client.report, entries, pids)


def _verdict(result: dict[str, Any]) -> dict[str, Any]:
    figures = result["lookup_128k"]
    zmq_p99 = figures["service_zmq"]["p99_ms"]
    valkey_p99 = figures["valkey"]["p99_ms"]
    verdict = {
        "valkey_p99_over_zmq_p99": valkey_p99 / zmq_p99,
        "valkey_p99_le_zmq_p99": valkey_p99 <= zmq_p99,
        "valkey_p99_le_5ms": valkey_p99 <= BAR_MS,
    }
    for count, arms in result.get("routers", {}).items():
        ratio = arms["valkey"]["p99_ms"] / arms["service_zmq"]["p99_ms"]
        verdict[f"routers_{count}_valkey_p99_over_zmq_p99"] = ratio
        paced = arms["valkey"]["paced_p99_ms"] / arms["service_zmq"]["paced_p99_ms"]
        verdict[f"routers_{count}_paced_valkey_p99_over_zmq_p99"] = paced
    return verdict


def report(result: dict[str, Any]) -> None:
    print(f"index lookup, {PROMPT_TOKENS // 1024}K-token prompt, {result['entries']:,} chunks "
          f"indexed, {NUM_INSTANCES} engines; load average {result['load_average']:.1f} on "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    print("  cpu: the asking thread's CPU time; server: the server processes' CPU per lookup")
    for name, f in result["lookup_128k"].items():
        server = "" if f["server_cpu_ms"] is None else f"  server {f['server_cpu_ms']:.2f} ms"
        print(f"  {name:<18} p50 {f['p50_ms']:6.2f} ms  p99 {f['p99_ms']:6.2f} ms  "
              f"(cpu p50 {f['cpu_p50_ms']:.2f}, p99 {f['cpu_p99_ms']:.2f}){server}  n={f['n']}  "
              f"round p99s {min(f['round_p99_ms']):.2f}-{max(f['round_p99_ms']):.2f}")  # fmt: skip
    v = result["verdict"]
    print(f"  bar: valkey p99 <= service_zmq p99 ({v['valkey_p99_over_zmq_p99']:.2f}x): "
          f"{'PASS' if v['valkey_p99_le_zmq_p99'] else 'FAIL'}; valkey p99 <= {BAR_MS} ms: "
          f"{'PASS' if v['valkey_p99_le_5ms'] else 'FAIL'}")  # fmt: skip
    for count, arms in result.get("routers", {}).items():
        print(f"{count} routers asking at once (one process each, {os.cpu_count()} CPUs):")
        _print_fleet(arms, "", lambda f: f"  {f['lookups_per_s']:7,.0f} lookups/s")
        print(f"  valkey p99 / service_zmq p99: "
              f"{v[f'routers_{count}_valkey_p99_over_zmq_p99']:.2f}x")  # fmt: skip
        offered = next(iter(arms.values()))["paced_per_s"]
        print(f"  paced, every backend at {offered:,.0f} lookups/s (Poisson arrivals):")
        _print_fleet(arms, "paced_", lambda f: "")
        print(f"  paced valkey p99 / service_zmq p99: "
              f"{v[f'routers_{count}_paced_valkey_p99_over_zmq_p99']:.2f}x")  # fmt: skip
    print("announce throughput (events/s; CPU per event: client / server):")
    for name, f in result["announce"].items():
        print(f"  {name:<18} bulk {f['bulk_events_per_s']:>9,.0f}/s "
              f"({f['bulk_client_cpu_us_per_event']:.2f} / {f['bulk_server_cpu_us_per_event']:.2f}"
              f" us)  steady {f['steady_events_per_s']:>9,.0f}/s "
              f"({f['steady_client_cpu_us_per_event']:.2f} / "
              f"{f['steady_server_cpu_us_per_event']:.2f} us)")  # fmt: skip
    print("memory for the index (MB): " + ", ".join(
        f"{name} {mb:,.0f}" for name, mb in result["memory_mb"].items()))  # fmt: skip


def _print_fleet(
    arms: dict[str, dict[str, Any]], prefix: str, extra: Callable[[dict[str, Any]], str]
) -> None:
    """One line per backend: p50/p99 (back to back, or ``paced_``) and the lookups."""
    for name, f in arms.items():
        print(f"  {name:<18} p50 {f[prefix + 'p50_ms']:6.2f} ms  p99 {f[prefix + 'p99_ms']:6.2f} ms"
              f"{extra(f)}  n={f[prefix + 'n']}")  # fmt: skip


def _counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",") if part.strip()]
    if any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"router counts must be >= 1, got {text!r}")
    return counts


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="kvstack bench index",
        description="Cluster KV index, both backends: 128K-token lookups with 1M chunks "
        "indexed, and announce throughput.",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per timed request
    parser.add_argument("--entries", type=int, default=1_000_000, help="chunks indexed")
    parser.add_argument("--lookups", type=int, default=3000, help="lookups per arm")
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds (the arms take turns every 10 lookups)"
    )
    parser.add_argument(
        "--routers",
        type=_counts,
        default=[2, 4],
        help="router counts asking at once, comma-separated ('' for none)",
    )
    parser.add_argument("--no-cluster", action="store_true", help="skip the Redis Cluster arm")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    started = time.time()
    result = measure(args)
    result.update(load_average=os.getloadavg()[0], instances=NUM_INSTANCES,
                  prompt_tokens=PROMPT_TOKENS, chunk_size=index_workload.CHUNK,
                  bar_p99_ms=BAR_MS, command=["kvstack", "bench", "index", *argv])  # fmt: skip
    result["verdict"] = _verdict(result)
    report(result)
    results.save("index", argv, result, args.json, started=started)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
