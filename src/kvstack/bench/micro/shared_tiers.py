"""Shared-tier throughput: Redis batched get and peer fetch against loopback TCP, same run.

    kvstack bench shared [--chunks 8] [--rounds 7] [--s3] [--json FILE]

Each figure is the median over rounds of one batched call moving ``--chunks`` chunks of the
Llama-3-8B shape (32 MiB, bf16) on loopback, with the range over rounds; every server is a
process of its own. The transfers are interleaved — each round runs every one of them once —
and each ratio to loopback TCP is taken per round (against that round's TCP figure), so a busy
machine slows the reference and the tiers alike and the ratios stay meaningful:

- ``tcp_loopback_gbps``: a sender process streams the same bytes over one TCP connection into
  preallocated buffers (``recv_into``) — the ceiling for any single-connection transfer here;
- ``redis``: two real ``redis-server`` processes, one stock and one started as kvstack starts
  its own (:mod:`kvstack.kv.tiers.redis.redis_server`: jemalloc keeps freed reply pages).
  ``get_gbps`` / ``tuned_get_gbps`` are ``RedisTier.get_many_into`` from each (values received
  into the output tensors and checksummed), ``redis_py_get_gbps`` plain redis-py pipelined
  GETs of the same values from the stock server (bytes only, no checksum), ``store_gbps``
  puts + flush to the stock server;
- ``peer``: an engine process lending its CPU tier; ``get_gbps`` is ``PeerTier.get_many_into``;
- ``s3`` (``--s3``): moto's S3 server in a process; store and get figures, for reference only
  (moto is a Python mock, not an S3 implementation to measure).

:func:`run_shared_tier_bench` returns the figures as a dict (``kvstack bench kv`` can merge it);
the command prints the tables the docs publish (:mod:`kvstack.bench.micro.shared_report`) and
ends with :func:`kvstack.bench.results.save` (``--json FILE``, else ``bench-results/shared/``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from kvstack.bench.micro import shared_procs, shared_report
from kvstack.bench.results import save
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tensors import byte_view, torch
from kvstack.kv.tiers import Tier, make_tier
from kvstack.kv.tiers.redis.redis_server import large_value_env
from kvstack.stack.ports import free_port

__all__ = [
    "per_round_ratio",
    "redis_server",
    "run",
    "run_shared_tier_bench",
    "shared_figures",
    "spread",
]

CHUNK_SHAPE = (32, 2, 256, 8, 128)  # Llama-3-8B, 256 tokens, bf16: 32 MiB
CHUNK_BYTES = torch.Size(CHUNK_SHAPE).numel() * 2
REDIS_BAR_GBPS = 1.0
PEER_BAR_RATIO = 0.5


class Transfer(NamedTuple):
    name: str
    num_bytes: int
    fetch: Callable[[], object]


def interleaved(transfers: list[Transfer], rounds: int) -> dict[str, list[float]]:
    """GB/s of each transfer in each of ``rounds`` rounds, one timed call of each per round."""
    for transfer in transfers:
        transfer.fetch()  # warm up connections and caches
    gbps: dict[str, list[float]] = {t.name: [] for t in transfers}
    for _ in range(rounds):
        for transfer in transfers:
            start = time.perf_counter()
            transfer.fetch()
            gbps[transfer.name].append(transfer.num_bytes / (time.perf_counter() - start) / 1e9)
    return gbps


def spread(values: list[float]) -> dict[str, float]:
    """Median, smallest and largest of a figure over rounds."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def per_round_ratio(values: list[float], reference: list[float]) -> dict[str, float]:
    """The spread of ``values[i] / reference[i]``: each round against that round's reference."""
    return spread([a / b for a, b in zip(values, reference, strict=True)])


def _wait_port(port: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _outs(num: int) -> list[torch.Tensor]:
    outs = [torch.empty(CHUNK_SHAPE, dtype=torch.bfloat16) for _ in range(num)]
    for out in outs:
        out.fill_(0)  # touch the pages: no page faults inside the timed reads
    return outs


def _load(tier: Tier, keys: list[ChunkKey], outs: list[torch.Tensor]) -> None:
    if not all(tier.get_many_into(keys, outs)):
        raise RuntimeError(f"{tier.name}: not every chunk came back")


def _store(tier: Tier, num_chunks: int, prefix: str) -> tuple[list[ChunkKey], float]:
    """Store ``num_chunks`` chunks; their keys and the store throughput (put + flush)."""
    keys = [ChunkKey(f"{prefix}{i:015d}".encode()) for i in range(num_chunks)]
    chunks = [torch.full(CHUNK_SHAPE, float(i), dtype=torch.bfloat16) for i in range(num_chunks)]
    start = time.perf_counter()
    tier.put_many(keys, chunks)
    if not tier.flush(600):
        raise RuntimeError(f"{tier.name}: writes did not finish")
    return keys, CHUNK_BYTES * num_chunks / (time.perf_counter() - start) / 1e9


@contextlib.contextmanager
def tcp_transfer(num_chunks: int) -> Iterator[Transfer]:
    proc, port = shared_procs.start_tcp_sender(CHUNK_BYTES)
    views = [byte_view(o) for o in _outs(num_chunks)]
    try:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            yield Transfer(
                "tcp", CHUNK_BYTES * num_chunks, lambda: shared_procs.tcp_fetch(sock, views)
            )
    finally:
        proc.kill()


@contextlib.contextmanager
def redis_server(workdir: Path, env: dict[str, str]) -> Iterator[int]:
    """A throw-away ``redis-server`` on loopback (no persistence, the caller's allocator
    settings in ``env``); yields its port."""
    port = free_port()
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(workdir)]  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if "MALLOC_CONF" not in k}, **env}
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_port(port)
        yield port
    finally:
        server.kill()
        server.wait()


@contextlib.contextmanager
def redis_transfers(num_chunks: int, workdir: Path) -> Iterator[tuple[list[Transfer], float]]:
    """The tier's batched get from a stock and a tuned server, and redis-py's pipelined get of
    the same values from the stock one; store GB/s."""
    import redis

    with contextlib.ExitStack() as stack:
        port = stack.enter_context(redis_server(workdir, {}))
        tuned_port = stack.enter_context(redis_server(workdir, large_value_env()))
        url = f"redis://127.0.0.1:{port}/0?prefix=bench:&queue_bytes=4GiB&timeout_s=60"
        tier = make_tier(url, name="redis")
        stack.callback(tier.close)
        keys, store_gbps = _store(tier, num_chunks, "r")
        outs = _outs(num_chunks)
        tuned = make_tier(url.replace(str(port), str(tuned_port)), name="redis-tuned")
        stack.callback(tuned.close)
        _store(tuned, num_chunks, "r")
        client = redis.Redis(port=port, socket_timeout=60)
        stack.callback(client.close)
        names = [b"bench:" + k.hex().encode() for k in keys]
        size = sum(int(client.strlen(n)) for n in names)

        def redis_py() -> None:
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.get(name)
            pipe.execute()

        yield (
            [
                Transfer("redis", CHUNK_BYTES * num_chunks, lambda: _load(tier, keys, outs)),
                Transfer("redis_tuned", CHUNK_BYTES * num_chunks, lambda: _load(tuned, keys, outs)),
                Transfer("redis_py", size, redis_py),
            ],
            store_gbps,
        )


@contextlib.contextmanager
def peer_transfer(num_chunks: int) -> Iterator[Transfer]:
    proc, port = shared_procs.start_lender(CHUNK_SHAPE, num_chunks)
    try:
        tier = make_tier(f"peer://127.0.0.1:{port}?timeout_s=60", name="peer")
        keys = [ChunkKey(k) for k in shared_procs.lender_keys(CHUNK_SHAPE[2], num_chunks)]
        outs = _outs(num_chunks)
        yield Transfer("peer", CHUNK_BYTES * num_chunks, lambda: _load(tier, keys, outs))
        tier.close()
    finally:
        proc.kill()


def measure_s3(num_chunks: int, rounds: int) -> dict[str, Any]:
    """Store and get against moto's server (a mock: figures for reference only)."""
    port = free_port()
    creds = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
             "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    for name, value in creds.items():
        os.environ.setdefault(name, value)
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env={**os.environ, **creds},
    )  # fmt: skip
    try:
        _wait_port(port)
        url = f"s3://bench/kv?endpoint_url=http://127.0.0.1:{port}&create_bucket=true&timeout_s=60"
        tier = make_tier(url, name="s3")
        keys, store_gbps = _store(tier, num_chunks, "s")
        outs = _outs(num_chunks)
        get = Transfer("s3", CHUNK_BYTES * num_chunks, lambda: _load(tier, keys, outs))
        rounds_gbps = interleaved([get], rounds)["s3"]
        figures: dict[str, Any] = {
            "store_gbps": store_gbps,
            "get_gbps": statistics.median(rounds_gbps),
            "get_gbps_spread": spread(rounds_gbps),
        }
        tier.close()
        return figures
    finally:
        server.kill()
        server.wait()


def run_shared_tier_bench(num_chunks: int = 8, rounds: int = 7, s3: bool = False) -> dict[str, Any]:
    """Figures for the shared tiers, with the loopback TCP reference of the same run."""
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvstack-bench-")))
        tcp = stack.enter_context(tcp_transfer(num_chunks))
        redis_pair, store_gbps = stack.enter_context(redis_transfers(num_chunks, workdir))
        peer = stack.enter_context(peer_transfer(num_chunks))
        per_round = interleaved([tcp, *redis_pair, peer], rounds)
    result = shared_figures(per_round, store_gbps, num_chunks)
    if s3:
        result["s3"] = measure_s3(min(num_chunks, 4), min(rounds, 3))
    return result


def shared_figures(
    per_round: dict[str, list[float]], store_gbps: float, num_chunks: int
) -> dict[str, Any]:
    """The result from every round's GB/s of ``tcp``, ``redis``, ``redis_tuned``, ``redis_py``
    and ``peer`` and the store figure: medians, ranges, per-round ratios to TCP, the bars."""
    gbps = {name: statistics.median(values) for name, values in per_round.items()}

    def ratio(name: str) -> dict[str, float]:
        return per_round_ratio(per_round[name], per_round["tcp"])

    result: dict[str, Any] = {
        "chunk_bytes": CHUNK_BYTES,
        "num_chunks": num_chunks,
        "rounds": len(per_round["tcp"]),
        "load_average": os.getloadavg()[0],
        "tcp_loopback_gbps": gbps["tcp"],
        "redis": {
            "get_gbps": gbps["redis"],
            "get_ratio_vs_tcp": ratio("redis")["median"],
            "tuned_get_gbps": gbps["redis_tuned"],
            "tuned_get_ratio_vs_tcp": ratio("redis_tuned")["median"],
            "redis_py_get_gbps": gbps["redis_py"],
            "store_gbps": store_gbps,
        },
        "peer": {"get_gbps": gbps["peer"], "ratio_vs_tcp": ratio("peer")["median"]},
        # Every transfer's GB/s over rounds, and its per-round ratio to loopback TCP.
        "spread_gbps": {name: spread(values) for name, values in per_round.items()},
        "ratio_vs_tcp": {name: ratio(name) for name in per_round},
        "rounds_gbps": per_round,
        "bar_redis_gbps": REDIS_BAR_GBPS,
        "bar_peer_ratio": PEER_BAR_RATIO,
    }
    result["bars"] = {
        "redis_get_ge_1gbps": gbps["redis_tuned"] >= REDIS_BAR_GBPS,
        "peer_ge_half_tcp": result["peer"]["ratio_vs_tcp"] >= PEER_BAR_RATIO,
    }
    return result


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="kvstack bench shared",
        description="Redis batched get and peer fetch of 32 MiB chunks against loopback TCP.",
    )
    parser.add_argument("--chunks", type=int, default=8, help="32 MiB chunks per batched call")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per figure (median)")
    parser.add_argument("--s3", action="store_true", help="also measure s3 against moto")
    parser.add_argument("--json", type=Path, help="the result file (default: bench-results/)")
    args = parser.parse_args(argv)
    started = time.time()
    result = run_shared_tier_bench(args.chunks, args.rounds, args.s3)
    print(shared_report.markdown(result))
    save("shared", argv, {**result, "args": vars(args)}, args.json, started=started)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
