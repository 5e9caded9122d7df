"""``redis://`` / ``rediss://`` tier URLs → node addresses, connection settings and options.

``redis://[user:password@]host:port[,host:port...]/db?prefix=kvstack:&ttl_s=0&cluster=false``
plus ``timeout_s``, ``connect_timeout_s``, ``password_env`` (read the password from an
environment variable instead of the URL), TLS files for ``rediss://`` (``ssl_ca_certs``,
``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs=required|none``), and the write queue and
breaker settings shared by remote tiers (``queue``, ``queue_bytes``, ``batch``,
``breaker_failures``, ``breaker_reset_s``, ``compression``).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from urllib.parse import unquote

from kvstack.errors import ConfigError
from kvstack.kv.tiers.base import TierURL
from kvstack.kv.tiers.redis.redis_nodes import NodeAddress
from kvstack.kv.tiers.redis.resp import RespSettings
from kvstack.kv.tiers.remote.options import (
    pop_bool,
    pop_compression,
    pop_float,
    pop_int,
    pop_size,
)

__all__ = ["RedisOptions", "parse_redis_url"]

DEFAULT_PORT = 6379


@dataclass(frozen=True)
class RedisOptions:
    seeds: list[NodeAddress]
    settings: RespSettings
    cluster: bool = False
    prefix: str = "kvstack:"
    ttl_ms: int = 0
    compression: str = "none"
    queue_chunks: int = 64
    queue_bytes: int = 1 << 30
    write_batch: int = 8
    breaker_failures: int = 3
    breaker_reset_s: float = 5.0

    @property
    def location(self) -> str:
        """Where the data lives, without credentials (names the shared tier in the index)."""
        nodes = ",".join(f"{a.host}:{a.port}" for a in self.seeds)
        return f"redis://{nodes}/{self.settings.db}/{self.prefix}"


def parse_redis_url(url: TierURL) -> RedisOptions:
    userinfo, _, hosts = url.netloc.rpartition("@")
    seeds = [_address(part, url) for part in hosts.split(",") if part]
    if not seeds:
        raise ConfigError(f"redis tier URL {url.url!r} names no host, e.g. redis://host:6379/0")
    user, password = _credentials(userinfo, url)
    cluster = pop_bool(url, "cluster", False)
    db = _db(url)
    if cluster and db:
        raise ConfigError(f"redis cluster has only database 0; {url.url!r} selects {db}")
    settings = RespSettings(
        username=user,
        password=password,
        db=db,
        ssl_context=_ssl_context(url) if url.scheme == "rediss" else None,
        connect_timeout_s=pop_float(url, "connect_timeout_s", 1.0, 0.001),
        timeout_s=pop_float(url, "timeout_s", 2.0, 0.001),
    )
    options = RedisOptions(
        seeds=seeds,
        settings=settings,
        cluster=cluster,
        prefix=url.pop("prefix") or "kvstack:",
        ttl_ms=int(pop_float(url, "ttl_s", 0.0) * 1000),
        compression=pop_compression(url),
        queue_chunks=pop_int(url, "queue", 64, 1),
        queue_bytes=pop_size(url, "queue_bytes", "1GiB"),
        write_batch=pop_int(url, "batch", 8, 1),
        breaker_failures=pop_int(url, "breaker_failures", 3, 1),
        breaker_reset_s=pop_float(url, "breaker_reset_s", 5.0, 0.001),
    )
    url.reject_unknown()
    return options


def _address(part: str, url: TierURL) -> NodeAddress:
    host, sep, port = part.rpartition(":")
    if not sep:
        return NodeAddress(part, DEFAULT_PORT)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"bad port {port!r} in redis tier URL {url.url!r}")
    return NodeAddress(host.strip("[]"), int(port))


def _credentials(userinfo: str, url: TierURL) -> tuple[str | None, str | None]:
    user, _, password = userinfo.partition(":")
    env = url.pop("password_env")
    if env:
        if env not in os.environ:
            raise ConfigError(f"password_env={env} in redis tier URL, but ${env} is not set")
        return unquote(user) or None, os.environ[env]
    return unquote(user) or None, unquote(password) if password else None


def _db(url: TierURL) -> int:
    path = url.path.strip("/")
    if not path:
        return 0
    if not path.isdigit():
        raise ConfigError(f"redis database {path!r} in {url.url!r} must be a number")
    return int(path)


def _ssl_context(url: TierURL) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=url.pop("ssl_ca_certs") or None)
    certfile, keyfile = url.pop("ssl_certfile"), url.pop("ssl_keyfile")
    if certfile:
        context.load_cert_chain(certfile, keyfile or None)
    reqs = (url.pop("ssl_cert_reqs") or "required").lower()
    if reqs not in ("required", "none"):
        raise ConfigError(f"ssl_cert_reqs={reqs!r} in {url.url!r} must be required or none")
    if reqs == "none":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
