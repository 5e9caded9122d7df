"""``redis://`` / ``rediss://`` index URLs → where Valkey is, how to log in, and the index's
own settings. No third-party imports: config sections check URLs with it.

``redis[s]://[user[:password]@]host:port[,host:port...][/db]?param=value&...``

- topology: one host (standalone), ``cluster=true`` (the hosts are seeds of a Redis Cluster), or
  ``sentinel=NAME`` (the hosts are Sentinels watching the primary NAME; they follow failovers);
- login: the URL's user and password (Valkey/Redis ACL users), or ``password_env=VAR``;
  Sentinels' own password: ``sentinel_password_env=VAR``; TLS for ``rediss://``:
  ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs=required|none``;
- the index: ``prefix`` (``kvstack:index:``; one fleet per prefix), ``buckets`` (hash-tagged
  slots the chunk entries are spread over: 1, or 16 in a cluster), ``instance_ttl_s`` (30: an
  engine silent for this long is no longer answered), ``max_lookup_tokens``, ``maintain_s`` (5: how
  often writers expire silent engines and clean up after them), ``send_ahead`` (128: a lookup
  writes each this many keys' ``MGET`` as soon as they are hashed; 0 sends it in one trip; a
  cluster always sends one trip);
- ``timeout_s`` and ``connect_timeout_s`` (default: the client's timeout).

Passwords never leave this module in text: :attr:`ValkeyIndexOptions.display` is the URL with
the password masked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from kvstack.errors import ConfigError
from kvstack.index.urls import VALKEY_SCHEMES, redact_url

__all__ = ["ValkeyIndexOptions", "parse_valkey_url"]

DEFAULT_PORT = 6379
DEFAULT_PREFIX = "kvstack:index:"
CLUSTER_BUCKETS = 16
DEFAULT_SEND_AHEAD = 128


@dataclass(frozen=True)
class ValkeyIndexOptions:
    display: str  # the URL, password masked
    seeds: list[tuple[str, int]]
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    db: int = 0
    tls: bool = False
    ssl: dict[str, str] = field(default_factory=dict)  # redis-py's ssl_* arguments
    cluster: bool = False
    sentinel: str = ""  # the primary's name when the seeds are Sentinels
    sentinel_password: str | None = field(default=None, repr=False)
    prefix: str = DEFAULT_PREFIX
    buckets: int = 1
    instance_ttl_s: float = 30.0
    timeout_s: float = 2.0
    connect_timeout_s: float = 2.0
    max_lookup_tokens: int = 1 << 21
    maintain_s: float = 5.0
    send_ahead: int = DEFAULT_SEND_AHEAD  # 0 in a cluster


def parse_valkey_url(url: str, timeout_s: float = 2.0) -> ValkeyIndexOptions:
    """Check ``url`` and read its settings; raises :class:`ConfigError` naming a bad part (the
    password masked)."""
    parts = urlsplit(url)
    shown = redact_url(url)
    if parts.scheme not in VALKEY_SCHEMES:
        raise ConfigError(f"a Valkey index URL starts with redis:// or rediss://, got {shown!r}")
    params = _params(parts.query, shown)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    seeds = [_address(h, shown) for h in hosts.split(",") if h]
    if not seeds:
        raise ConfigError(f"Valkey index URL {shown!r} names no host, e.g. redis://host:6379/0")
    username, password = _credentials(userinfo, params.pop("password_env", ""), shown)
    cluster = _bool(params.pop("cluster", "false"), "cluster", shown)
    sentinel = params.pop("sentinel", "")
    db = _db(parts.path, shown)
    if cluster and (db or sentinel):
        raise ConfigError(f"a Redis Cluster has only database 0 and no Sentinel: {shown!r}")
    options = ValkeyIndexOptions(
        display=shown,
        seeds=seeds,
        username=username,
        password=password,
        db=db,
        tls=parts.scheme == "rediss",
        ssl=_ssl(params, parts.scheme == "rediss", shown),
        cluster=cluster,
        sentinel=sentinel,
        sentinel_password=_env(params.pop("sentinel_password_env", ""), shown),
        prefix=_prefix(params.pop("prefix", DEFAULT_PREFIX), shown),
        buckets=_int(
            params.pop("buckets", str(CLUSTER_BUCKETS if cluster else 1)), "buckets", shown, 1, 4096
        ),
        instance_ttl_s=_float(params.pop("instance_ttl_s", "30"), "instance_ttl_s", shown),
        timeout_s=_float(params.pop("timeout_s", str(timeout_s)), "timeout_s", shown),
        connect_timeout_s=_float(
            params.pop("connect_timeout_s", str(timeout_s)), "connect_timeout_s", shown
        ),
        max_lookup_tokens=_int(
            params.pop("max_lookup_tokens", str(1 << 21)), "max_lookup_tokens", shown, 1, 1 << 30
        ),
        maintain_s=_float(params.pop("maintain_s", "5"), "maintain_s", shown),
        send_ahead=_send_ahead(params.pop("send_ahead", None), cluster, shown),
    )
    if params:
        raise ConfigError(f"unknown parameter(s) {', '.join(sorted(params))} in {shown!r}")
    return options


def _send_ahead(text: str | None, cluster: bool, shown: str) -> int:
    if text is None:
        return 0 if cluster else DEFAULT_SEND_AHEAD
    value = _int(text, "send_ahead", shown, 0, 1 << 16)
    if cluster and value:
        raise ConfigError(
            f"send_ahead works standalone and behind Sentinel; a Redis Cluster's lookup goes to "
            f"several nodes in one trip (use send_ahead=0 or leave it out): {shown!r}"
        )
    return value


def _params(query: str, shown: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in params:
            raise ConfigError(f"parameter {name!r} given twice in {shown!r}")
        params[name] = value
    return params


def _address(part: str, shown: str) -> tuple[str, int]:
    host, sep, port = part.rpartition(":")
    if not sep or part.endswith("]"):
        return part.strip("[]"), DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"bad port {port!r} in {shown!r}")
    return host.strip("[]"), int(port)


def _credentials(userinfo: str, env: str, shown: str) -> tuple[str | None, str | None]:
    user, _, password = userinfo.partition(":")
    if env:
        return unquote(user) or None, _env(env, shown)
    return unquote(user) or None, unquote(password) if password else None


def _env(name: str, shown: str) -> str | None:
    if not name:
        return None
    if name not in os.environ:
        raise ConfigError(f"{shown!r} reads a password from ${name}, which is not set")
    return os.environ[name]


def _db(path: str, shown: str) -> int:
    db = path.strip("/")
    if db and not db.isdigit():
        raise ConfigError(f"Valkey database {db!r} in {shown!r} must be a number")
    return int(db or 0)


def _ssl(params: dict[str, str], tls: bool, shown: str) -> dict[str, str]:
    names = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")
    given = {name: params.pop(name) for name in names if name in params}
    if given and not tls:
        raise ConfigError(f"{', '.join(given)} need a rediss:// URL, got {shown!r}")
    reqs = given.get("ssl_cert_reqs", "required").lower()
    if reqs not in ("required", "none"):
        raise ConfigError(f"ssl_cert_reqs={reqs!r} in {shown!r} must be required or none")
    if tls:
        given["ssl_cert_reqs"] = reqs
    return given


def _prefix(value: str, shown: str) -> str:
    if not value or "{" in value or "}" in value:
        raise ConfigError(
            f"prefix {value!r} in {shown!r} must be non-empty, without braces "
            "(the index puts hash tags around it)"
        )
    return value


def _bool(value: str, name: str, shown: str) -> bool:
    lowered = value.lower()
    if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"{name}={value!r} in {shown!r} must be true or false")
    return lowered in ("true", "1", "yes")


def _int(value: str, name: str, shown: str, low: int, high: int) -> int:
    if not value.isdigit() or not low <= int(value) <= high:
        raise ConfigError(f"{name}={value!r} in {shown!r} must be an integer in [{low}, {high}]")
    return int(value)


def _float(value: str, name: str, shown: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number > 0:
        raise ConfigError(f"{name}={value!r} in {shown!r} must be a positive number")
    return number
