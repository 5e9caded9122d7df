"""The servers ``kvstack bench index`` measures against, each in its own process on loopback:
the index server (HTTP and ZMQ), a ``redis-server``, and a 3-master Redis Cluster; and the CPU
seconds a process has used (from ``/proc``), to put server CPU beside client CPU."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from kvstack.stack.ports import free_port

__all__ = ["free_port", "index_server", "process_cpu_s", "redis_cluster", "redis_server"]


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def index_server() -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """``kvstack index-server`` with HTTP and ZMQ: (process, http port, zmq port)."""
    port, zmq_port = free_port(), free_port()
    # The benchmark's engines report in bulk and then go quiet: no expiry during the run.
    argv = [sys.executable, "-m", "kvstack", "index-server", "--host", "127.0.0.1", "--port",
            str(port), "--zmq-port", str(zmq_port), "--instance-ttl-s", "3600"]  # fmt: skip
    env = {**os.environ, "KVSTACK_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200,
              proc, "index server")  # fmt: skip
        yield proc, port, zmq_port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _redis(port: int, workdir: Path, *extra: str) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(workdir), *extra]  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    _wait(lambda: _ping(port), proc, "redis-server")
    return proc


def _ping(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
        s.sendall(b"*1\r\n$4\r\nPING\r\n")
        return s.recv(64).startswith(b"+PONG")


def _wait(ready: object, proc: subprocess.Popen[bytes], what: str) -> None:
    assert callable(ready)
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError, httpx.HTTPError):
            if ready():
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.05)


@contextlib.contextmanager
def redis_server() -> Iterator[tuple[list[subprocess.Popen[bytes]], str, list[int]]]:
    """One ``redis-server``: ([process], its URL, [port])."""
    with tempfile.TemporaryDirectory(prefix="kvstack-bench-index-") as tmp:
        port = free_port()
        proc = _redis(port, Path(tmp))
        try:
            yield [proc], f"redis://127.0.0.1:{port}/0", [port]
        finally:
            proc.kill()
            proc.wait(timeout=30)


@contextlib.contextmanager
def redis_cluster() -> Iterator[tuple[list[subprocess.Popen[bytes]], str, list[int]]]:
    """Three masters joined as a Redis Cluster: (processes, a URL with ``cluster=true``, ports)."""
    with tempfile.TemporaryDirectory(prefix="kvstack-bench-index-") as tmp:
        ports = [free_port(bus=True) for _ in range(3)]
        procs = []
        try:
            for port in ports:
                procs.append(_redis(port, Path(tmp) / str(port), "--cluster-enabled", "yes",
                                    "--cluster-config-file", "nodes.conf"))  # fmt: skip
            _create_cluster(ports)
            hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
            yield procs, f"redis://{hosts}/0?cluster=true", ports
        finally:
            for proc in procs:
                proc.kill()
                proc.wait(timeout=30)


def _create_cluster(ports: list[int]) -> None:
    cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
    addresses = [f"127.0.0.1:{p}" for p in ports]
    subprocess.run([cli, "--cluster", "create", *addresses, "--cluster-replicas", "0",
                    "--cluster-yes"], capture_output=True, check=True, timeout=60)  # fmt: skip
    deadline = time.monotonic() + 30
    info = ""
    while "cluster_state:ok" not in info:
        if time.monotonic() > deadline:
            raise RuntimeError("redis cluster did not reach state ok")
        time.sleep(0.05)
        info = subprocess.run([cli, "-p", str(ports[0]), "CLUSTER", "INFO"],
                              capture_output=True, text=True, timeout=30).stdout  # fmt: skip
