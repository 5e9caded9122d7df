"""``python -m kvstack.bench.routers.replicas --replicas N [--serve K] --port P -- ARGV``

N router replicas and a spreader in front of the first K of them (all N by default), as one
front end of ``kvstack bench compare``. Starting replicas that get no traffic keeps the
background work of every arm the same (each replica subscribes to every engine's KV events and
scrapes every engine): arms that differ only in K differ only in how requests, and so the
replicas' soft state, are divided. With ``--share``, a ``redis-server`` is started too and
every replica gets ``router.prefix.share_url`` pointing at it (the replicas share their
in-flight requests and routed prompts: :mod:`kvstack.router.prefix.replicas`).

``ARGV`` is one replica's command with ``{port}`` where its port goes (in an experiment file,
write ``{{port}}``: compare fills ``{port}`` itself). The replicas start on
free ports; once every one answers ``/health``, the spreader listens on ``P``, spreading
client connections over them (:mod:`.spread`). On exit it prints how many connections each
replica got, and stops them all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

from kvstack.bench.routers.spread import Spreader, picker
from kvstack.stack.ports import free_port

__all__ = ["main"]


def _start(argv: list[str], port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    command = [arg.replace("{port}", str(port)) for arg in argv]
    return subprocess.Popen(command, start_new_session=True, env=env)


def _valkey(workdir: str) -> tuple[subprocess.Popen[bytes], str]:
    """A ``redis-server`` for the replicas to share through, and its URL."""
    port = free_port()
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
            "no", "--dir", workdir]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("redis-server for --share did not start") from None
            time.sleep(0.05)


def _wait_healthy(ports: list[int], procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(ports)
    while pending:
        for proc in procs:
            if proc.poll() is not None:
                raise SystemExit(f"a router replica exited with {proc.returncode}")
        for port in list(pending):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    pending.discard(port)
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            raise SystemExit(f"router replicas on ports {sorted(pending)} did not get healthy")
        time.sleep(0.2)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


async def _serve(spreader: Spreader, port: int) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.create_task(spreader.serve("127.0.0.1", port))
    await stop.wait()
    task.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstack.bench.routers.replicas")
    parser.add_argument("--replicas", type=int, required=True)
    parser.add_argument("--serve", type=int, help="replicas that get connections (default all)")
    parser.add_argument("--port", type=int, required=True, help="where clients connect")
    parser.add_argument("--spread", default="random", choices=["random", "round-robin"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--share", action="store_true", help="replicas share soft state")
    parser.add_argument("--start-timeout", type=float, default=120.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- a replica's argv")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    serve = args.serve or args.replicas
    if args.replicas < 1 or not command or not 1 <= serve <= args.replicas:
        parser.error("give --replicas >= 1, --serve in [1, replicas], a replica command after --")
    ports = [free_port() for _ in range(args.replicas)]
    env = dict(os.environ)
    procs: list[subprocess.Popen[bytes]] = []
    workdir = tempfile.TemporaryDirectory(prefix="kvstack-replicas-")
    if args.share:
        valkey, url = _valkey(workdir.name)
        procs.append(valkey)
        env["KVSTACK_ROUTER_PREFIX__SHARE_URL"] = url
    procs += [_start(command, port, env) for port in ports]
    try:
        _wait_healthy(ports, procs, args.start_timeout)
        spreader = Spreader(picker(args.spread, ports[:serve], args.seed))
        asyncio.run(_serve(spreader, args.port))
        print(f"connections per replica: {[spreader.connections.get(p, 0) for p in ports]}",
              flush=True)  # fmt: skip
    finally:
        _stop(procs)
        workdir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
