"""A Valkey primary with a replica and a Sentinel watching them, on loopback: the failover
setup of the index tests (the same redis-server binary runs in Sentinel mode)."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from kvstack.stack.ports import free_port
from tests.kv.tiers.remote.servers import REDIS_SERVER, RedisServer

MASTER = "kvindex"


class SentinelSet:
    """A primary, a replica and one Sentinel (quorum 1) that promotes the replica 0.5 s after
    the primary stops answering."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.primary = RedisServer(workdir / "primary")
        self.replica = RedisServer(workdir / "replica")
        self.sentinel_port = free_port()
        self.sentinel: subprocess.Popen[bytes] | None = None

    def url(self, **params: object) -> str:
        query = "&".join([f"sentinel={MASTER}", f"prefix=f{uuid.uuid4().hex[:8]}:",
                          *(f"{k}={v}" for k, v in params.items())])  # fmt: skip
        return f"redis://127.0.0.1:{self.sentinel_port}/0?{query}"

    def start(self) -> SentinelSet:
        self.primary.start()
        self.replica.extra += ["--replicaof", "127.0.0.1", str(self.primary.port)]
        self.replica.start()
        conf = self.workdir / "sentinel.conf"
        conf.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {self.workdir}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary.port} 1\n"
            f"sentinel down-after-milliseconds {MASTER} 500\n"
            f"sentinel failover-timeout {MASTER} 5000\n"
        )
        log = (self.workdir / "sentinel.log").open("ab")
        with log:
            self.sentinel = subprocess.Popen([REDIS_SERVER, str(conf), "--sentinel"],
                                             stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        self.wait(lambda: "master_link_status:up" in self.replica.cli("INFO", "replication"),
                  "the replica's link to the primary")  # fmt: skip
        self.wait(lambda: str(self.replica.port) in self._sentinel("SENTINEL", "REPLICAS", MASTER),
                  "the Sentinel seeing the replica")  # fmt: skip
        return self

    def _sentinel(self, *args: str) -> str:
        argv = [REDIS_SERVER.replace("redis-server", "redis-cli"), "-p", str(self.sentinel_port)]
        done = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=30)
        return done.stdout

    def primary_port(self) -> int:
        """The port of the primary the Sentinel names now."""
        reply = self._sentinel("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER).split()
        return int(reply[1]) if len(reply) == 2 else 0

    def wait_replicated(self) -> None:
        """Until the replica has received every write the primary took."""
        offset = self.primary.cli("INFO", "replication").partition("master_repl_offset:")[2]
        target = int(offset.split()[0])

        def caught_up() -> bool:
            info = self.replica.cli("INFO", "replication")
            return int(info.partition("slave_repl_offset:")[2].split()[0]) >= target

        self.wait(caught_up, f"the replica reaching replication offset {target}")

    @staticmethod
    def wait(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
        """Until ``check()``; fails naming ``what`` it waited for."""
        deadline = time.monotonic() + timeout_s
        while not check():
            assert time.monotonic() < deadline, f"Valkey setup: no {what} within {timeout_s:g} s"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.sentinel is not None and self.sentinel.poll() is None:
            self.sentinel.kill()
            self.sentinel.wait(timeout=10)
        self.replica.stop()
        self.primary.stop()
