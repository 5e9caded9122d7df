"""Real servers for the remote tier tests: redis-server (standalone, TLS, a 3-node cluster) and
moto's S3 server, each on free loopback ports, started and stopped by the tests themselves."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from kvstack.stack.ports import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    return free_port(bus=True)


def _ping(port: int, password: str | None = None) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            if password:
                s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(password), password.encode()))
                s.recv(64)
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process (no persistence) in its own process group."""

    def __init__(self, workdir: Path, port: int | None = None, *extra: str) -> None:
        self.port = free_port() if port is None else port
        self.workdir = workdir
        self.extra = list(extra)
        self.password: str | None = None
        if "--requirepass" in self.extra:
            self.password = self.extra[self.extra.index("--requirepass") + 1]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, ready_port: int | None = None) -> RedisServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir), *self.extra]  # fmt: skip
        log = open(self.workdir / f"redis-{self.port}.log", "ab")  # noqa: SIM115
        with log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        if ready_port != 0:
            self._wait_ready(ready_port or self.port)
        return self

    def _wait_ready(self, port: int) -> None:
        deadline = time.monotonic() + 10
        while not _ping(port, self.password):
            assert self.proc is not None and self.proc.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, f"redis-server on {port} not ready"
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def cli(self, *args: str) -> str:
        auth = ["-a", self.password, "--no-auth-warning"] if self.password else []
        cmd = [REDIS_CLI, "-p", str(self.port), *auth, *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGCONT)
        self.kill()


class RedisCluster:
    """Three masters on loopback joined with ``redis-cli --cluster create``."""

    def __init__(self, workdir: Path) -> None:
        self.nodes = [
            RedisServer(workdir / f"node{i}", free_cluster_port(), "--cluster-enabled", "yes",
                        "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
            for i in range(3)
        ]  # fmt: skip

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"redis://{hosts}/0?cluster=true"

    def start(self) -> RedisCluster:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *addresses, "--cluster-replicas", "0",
             "--cluster-yes"],
            capture_output=True, check=True, timeout=60,
        )  # fmt: skip
        # Every node, not only the first, must see all masters and all slots: a write routed to
        # a node still converging gets CLUSTERDOWN, which the tier counts as a dropped write.
        deadline = time.monotonic() + 30
        while not all(self._converged(node) for node in self.nodes):
            assert time.monotonic() < deadline, "redis cluster did not converge on every node"
            time.sleep(0.05)
        return self

    def _converged(self, node: RedisServer) -> bool:
        info = node.cli("CLUSTER", "INFO")
        wanted = (
            "cluster_state:ok",
            "cluster_slots_ok:16384",
            f"cluster_known_nodes:{len(self.nodes)}",
        )
        return all(line in info for line in wanted)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class MotoS3:
    """moto's S3 server (threaded, in this process) on a free loopback port."""

    def __init__(self, port: int | None = None) -> None:
        self.port = free_port() if port is None else port
        self._server: object | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoS3:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()  # type: ignore[attr-defined]
            self._server = None

    def client(self) -> object:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
