"""Shared-tier throughput: Redis batched get and peer fetch against loopback TCP, same run.

    python -m kvstack.bench.shared_tiers [--chunks 8] [--rounds 5] [--s3] [--json FILE]

Each figure is the median over rounds of one batched call moving ``--chunks`` chunks of the
Llama-3-8B shape (32 MiB, bf16) on loopback; every server is a process of its own:

- ``tcp_loopback_gbps``: a sender process streams the same bytes over one TCP connection into
  preallocated buffers (``recv_into``) — the ceiling for any single-connection transfer here;
- ``redis``: a real ``redis-server``; ``get_gbps`` is ``RedisTier.get_many_into`` (values
  received into the output tensors and checksummed), ``redis_py_get_gbps`` plain redis-py
  pipelined GETs of the same values (bytes only, no checksum), ``store_gbps`` puts + flush;
- ``peer``: an engine process lending its CPU tier; ``get_gbps`` is ``PeerTier.get_many_into``;
- ``s3`` (``--s3``): moto's S3 server in a process; store and get figures, for reference only
  (moto is a Python mock, not an S3 implementation to measure).

:func:`run_shared_tier_bench` returns the figures as a dict (``kvstack bench kv`` can merge it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstack.bench import shared_procs
from kvstack.kv.keys import ChunkKey
from kvstack.kv.tensors import byte_view, torch
from kvstack.kv.tiers import Tier, make_tier

__all__ = ["run", "run_shared_tier_bench"]

CHUNK_SHAPE = (32, 2, 256, 8, 128)  # Llama-3-8B, 256 tokens, bf16: 32 MiB
REDIS_BAR_GBPS = 1.0
PEER_BAR_RATIO = 0.5


def _median_gbps(num_bytes: int, rounds: int, call: Callable[[], object]) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return num_bytes / statistics.median(times) / 1e9


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _outs(num: int, shape: tuple[int, ...] = CHUNK_SHAPE) -> list[torch.Tensor]:
    outs = [torch.empty(shape, dtype=torch.bfloat16) for _ in range(num)]
    for out in outs:
        out.fill_(0)  # touch the pages: no page faults inside the timed reads
    return outs


def measure_tcp(num_chunks: int, rounds: int) -> float:
    chunk_bytes = torch.Size(CHUNK_SHAPE).numel() * 2
    proc, port = shared_procs.start_tcp_sender(chunk_bytes)
    outs = _outs(num_chunks)
    views = [byte_view(o) for o in outs]
    try:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            shared_procs.tcp_fetch(sock, views)  # warm up
            return _median_gbps(
                chunk_bytes * num_chunks, rounds, lambda: shared_procs.tcp_fetch(sock, views)
            )
    finally:
        proc.kill()


def _check(tier: Tier, keys: list[ChunkKey], outs: list[torch.Tensor]) -> None:
    if not all(tier.get_many_into(keys, outs)):
        raise RuntimeError(f"{tier.name}: not every chunk came back")


def _tier_figures(tier: Tier, num_chunks: int, rounds: int, prefix: str) -> dict[str, float]:
    chunk_bytes = torch.Size(CHUNK_SHAPE).numel() * 2
    keys = [ChunkKey(f"{prefix}{i:012d}".encode()[:16].ljust(16, b"-")) for i in range(num_chunks)]
    chunks = [torch.full(CHUNK_SHAPE, float(i), dtype=torch.bfloat16) for i in range(num_chunks)]
    start = time.perf_counter()
    tier.put_many(keys, chunks)
    if not tier.flush(600):
        raise RuntimeError(f"{tier.name}: writes did not finish")
    store_gbps = chunk_bytes * num_chunks / (time.perf_counter() - start) / 1e9
    outs = _outs(num_chunks)
    _check(tier, keys, outs)  # warm up (and check)
    get_gbps = _median_gbps(chunk_bytes * num_chunks, rounds, lambda: _check(tier, keys, outs))
    return {"store_gbps": store_gbps, "get_gbps": get_gbps}


def measure_redis(num_chunks: int, rounds: int, workdir: Path) -> dict[str, float]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = _free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(workdir)]  # fmt: skip
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        tier = _wait_for_tier(
            f"redis://127.0.0.1:{port}/0?prefix=bench:&queue_bytes=4GiB&timeout_s=30"
        )
        figures = _tier_figures(tier, num_chunks, rounds, "r")
        figures["redis_py_get_gbps"] = _redis_py_gbps(port, tier, num_chunks, rounds)
        tier.close()
        return figures
    finally:
        server.kill()
        server.wait()


def _wait_for_tier(url: str) -> Tier:
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", int(url.split(":")[2].split("/")[0]))):
                break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    return make_tier(url, name="redis")


def _redis_py_gbps(port: int, tier: Tier, num_chunks: int, rounds: int) -> float:
    import redis

    client = redis.Redis(port=port)
    names = [n.decode() for n in client.scan_iter(match="bench:*", count=1000)]

    def fetch() -> None:
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.get(name)
        pipe.execute()

    fetch()
    size = sum(int(client.strlen(n)) for n in names)
    gbps = _median_gbps(size, rounds, fetch)
    client.close()
    return gbps


def measure_peer(num_chunks: int, rounds: int) -> dict[str, float]:
    chunk_bytes = torch.Size(CHUNK_SHAPE).numel() * 2
    proc, port = shared_procs.start_lender(CHUNK_SHAPE, num_chunks)
    try:
        tier = make_tier(f"peer://127.0.0.1:{port}?timeout_s=30", name="peer")
        keys = [ChunkKey(k) for k in shared_procs.lender_keys(CHUNK_SHAPE[2], num_chunks)]
        outs = _outs(num_chunks)
        _check(tier, keys, outs)
        gbps = _median_gbps(chunk_bytes * num_chunks, rounds, lambda: _check(tier, keys, outs))
        tier.close()
        return {"get_gbps": gbps}
    finally:
        proc.kill()


def measure_s3(num_chunks: int, rounds: int) -> dict[str, float]:
    import os

    port = _free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip
    os.environ.update(
        {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        url = f"s3://bench/kv?endpoint_url=http://127.0.0.1:{port}&create_bucket=true&timeout_s=60"
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        tier = make_tier(url, name="s3")
        figures = _tier_figures(tier, num_chunks, rounds, "s")
        tier.close()
        return figures
    finally:
        server.kill()
        server.wait()


def run_shared_tier_bench(num_chunks: int = 8, rounds: int = 5, s3: bool = False) -> dict[str, Any]:
    """Figures for the shared tiers, with the loopback TCP reference of the same run."""
    chunk_bytes = torch.Size(CHUNK_SHAPE).numel() * 2
    with tempfile.TemporaryDirectory(prefix="kvstack-bench-shared-") as workdir:
        tcp = measure_tcp(num_chunks, rounds)
        redis_figures = measure_redis(num_chunks, rounds, Path(workdir))
        peer_figures = measure_peer(num_chunks, rounds)
        tcp_after = measure_tcp(num_chunks, rounds)  # the machine may have changed meanwhile
    reference = statistics.median([tcp, tcp_after])
    redis_figures["get_ratio_vs_tcp"] = redis_figures["get_gbps"] / reference
    peer_figures["ratio_vs_tcp"] = peer_figures["get_gbps"] / reference
    result: dict[str, Any] = {
        "chunk_bytes": chunk_bytes,
        "num_chunks": num_chunks,
        "rounds": rounds,
        "tcp_loopback_gbps": reference,
        "tcp_loopback_runs_gbps": [tcp, tcp_after],
        "redis": redis_figures,
        "peer": peer_figures,
        "bars": {
            "redis_get_ge_1gbps": redis_figures["get_gbps"] >= REDIS_BAR_GBPS,
            "peer_ge_half_tcp": peer_figures["ratio_vs_tcp"] >= PEER_BAR_RATIO,
        },
    }
    if s3:
        result["s3"] = measure_s3(min(num_chunks, 4), min(rounds, 3))
    return result


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def _print(result: dict[str, Any]) -> None:
    tcp, bars = result["tcp_loopback_gbps"], result["bars"]
    r, p = result["redis"], result["peer"]
    runs = ", ".join(f"{x:.2f}" for x in result["tcp_loopback_runs_gbps"])
    mib = result["chunk_bytes"] / 2**20
    print(f"{result['num_chunks']} chunks x {mib:.0f} MiB, median of {result['rounds']} rounds")
    print(f"  loopback TCP reference     {tcp:6.2f} GB/s  (before, after: {runs})")
    print(f"  redis batched get          {r['get_gbps']:6.2f} GB/s  "
          f"{r['get_ratio_vs_tcp']:.2f}x TCP  bar >= {REDIS_BAR_GBPS} GB/s: "
          f"{_verdict(bars['redis_get_ge_1gbps'])}")  # fmt: skip
    print(f"  redis-py pipelined get     {r['redis_py_get_gbps']:6.2f} GB/s  (same values)")
    print(f"  redis store (put + flush)  {r['store_gbps']:6.2f} GB/s")
    print(f"  peer fetch                 {p['get_gbps']:6.2f} GB/s  "
          f"{p['ratio_vs_tcp']:.2f}x TCP  bar >= {PEER_BAR_RATIO}x TCP: "
          f"{_verdict(bars['peer_ge_half_tcp'])}")  # fmt: skip
    if "s3" in result:
        s3 = result["s3"]
        print(f"  s3 (moto) get / store      {s3['get_gbps']:6.2f} / {s3['store_gbps']:.2f} GB/s")


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvstack.bench.shared_tiers",
        description="Redis batched get and peer fetch of 32 MiB chunks against loopback TCP.",
    )
    parser.add_argument("--chunks", type=int, default=8, help="32 MiB chunks per batched call")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per figure (median)")
    parser.add_argument("--s3", action="store_true", help="also measure s3 against moto")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    result = run_shared_tier_bench(args.chunks, args.rounds, args.s3)
    _print(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
