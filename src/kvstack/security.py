"""The cluster secret: one file that makes a set of kvstack processes one trusted cluster.

Every internal listener (the index service over HTTP and ZMQ, peer servers, announcements)
authenticates its callers with keys derived from this secret, and every chunk written to a tier
carries a MAC keyed from it. Without a secret, components listen on loopback only; binding any
other address without one refuses to start unless ``insecure_no_auth`` says so explicitly (and a
warning is logged at every start). See ``docs/security.md`` for the threat model.

Config (section ``security``; ``KVSTACK_SECURITY_*`` overrides like every key)::

    security:
      cluster_secret_file: /run/secrets/kvstack/cluster-secret   # >= 32 random bytes
      previous_secret_file: /run/secrets/kvstack/previous        # accepted for reads in a rollover
      insecure_no_auth: false

Distinct uses get distinct keys, derived with keyed BLAKE2b (``person`` = the purpose), so a
key that authenticates index calls cannot forge a chunk MAC or a tenant salt. During a rotation
the new secret signs and the previous one still verifies (:meth:`ClusterKeys.verifiers`).

The secret never appears in logs, ``repr`` or ``kvstack config show``: only its fingerprint
(the first 8 hex digits of a derived, non-secret digest) does.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from kvstack.errors import ConfigError
from kvstack.section import Section, load_section

__all__ = [
    "MIN_SECRET_BYTES",
    "PURPOSES",
    "ClusterKeys",
    "SecurityConfig",
    "check_bind",
    "is_loopback",
    "load_keys",
    "load_security",
    "write_secret_file",
]

log = logging.getLogger(__name__)

MIN_SECRET_BYTES = 32
# Every derived key's purpose. BLAKE2b's `person` is at most 16 bytes.
PURPOSES = frozenset(
    {
        "index-http",  # bearer tokens / request MACs on the index service's HTTP routes
        "index-zmq",  # frame MACs on the index service's ZMQ endpoint
        "peer",  # the peer server's connect-time challenge
        "announce",  # engines' announcements (bound to their instance id)
        "chunk-mac",  # the MAC every stored chunk carries
        "tenant-salt",  # the router's per-tenant cache salts
        "epp",  # the bearer token a gateway sends to the endpoint picker (ext_proc metadata)
    }
)


class SecurityConfig(Section):
    """The ``security`` section."""

    cluster_secret_file: str | None = Field(
        default=None,
        description="file holding the cluster secret (>= 32 bytes); none: loopback only",
    )
    previous_secret_file: str | None = Field(
        default=None,
        description="the secret being rotated out: still accepted for reads and checks",
    )
    insecure_no_auth: bool = Field(
        default=False, description="listen beyond loopback without a secret (warned at every start)"
    )


@dataclass(frozen=True)
class ClusterKeys:
    """Keys derived from the current (and, while rotating, the previous) cluster secret."""

    _current: bytes = field(repr=False)
    _previous: bytes | None = field(default=None, repr=False)
    # purpose -> (current key, previous key or None): derived once, read on hot paths
    _derived: dict[str, tuple[bytes, bytes | None]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for secret in (self._current, self._previous):
            if secret is not None and len(secret) < MIN_SECRET_BYTES:
                raise ConfigError(
                    f"a cluster secret needs at least {MIN_SECRET_BYTES} bytes, got {len(secret)}"
                )

    def _pair(self, purpose: str) -> tuple[bytes, bytes | None]:
        pair = self._derived.get(purpose)
        if pair is None:
            previous = None if self._previous is None else _derive(self._previous, purpose)
            pair = self._derived[purpose] = (_derive(self._current, purpose), previous)
        return pair

    def key(self, purpose: str) -> bytes:
        """The current 32-byte key for ``purpose``: what new MACs and tokens are made with."""
        return self._pair(purpose)[0]

    def verifiers(self, purpose: str) -> tuple[bytes, ...]:
        """Keys a MAC or token may verify under: the current one, then the previous one."""
        current, previous = self._pair(purpose)
        return (current,) if previous is None else (current, previous)

    @property
    def rotating(self) -> bool:
        """Whether a previous secret is still accepted."""
        return self._previous is not None

    def mac(self, purpose: str, *parts: bytes, size: int = 16) -> bytes:
        """A ``size``-byte keyed BLAKE2b MAC over ``parts`` with the current key."""
        return _mac(self.key(purpose), parts, size)

    def check(self, purpose: str, tag: bytes, *parts: bytes) -> bool:
        """Whether ``tag`` is a MAC of ``parts`` under the current or the previous key
        (compared in constant time)."""
        return any(
            hmac.compare_digest(tag, _mac(key, parts, len(tag))) for key in self.verifiers(purpose)
        )

    @property
    def fingerprint(self) -> str:
        """A short, non-secret name for the current secret (safe to log)."""
        return _derive(self._current, "fingerprint").hex()[:8]

    def __repr__(self) -> str:
        rotating = ", rotating" if self._previous is not None else ""
        return f"ClusterKeys(fingerprint={self.fingerprint}{rotating})"


def load_keys(config: SecurityConfig) -> ClusterKeys | None:
    """The keys from ``config``'s secret files, or None when no secret is configured."""
    if config.cluster_secret_file is None:
        if config.previous_secret_file is not None:
            raise ConfigError(
                "security.previous_secret_file is set without security.cluster_secret_file"
            )
        return None
    current = _read_secret(config.cluster_secret_file, "security.cluster_secret_file")
    previous = None
    if config.previous_secret_file is not None:
        previous = _read_secret(config.previous_secret_file, "security.previous_secret_file")
    return ClusterKeys(current, previous)


def load_security(
    data: Mapping[str, Any] | None = None, path: str | Path | None = None
) -> tuple[SecurityConfig, ClusterKeys | None]:
    """The ``security`` section (YAML named by ``KVSTACK_CONFIG`` or ``path``, then ``data``,
    then ``KVSTACK_SECURITY_*``) and the keys it names: what every component calls when it is
    not handed keys."""
    config = load_section("security", SecurityConfig, data, path=path)
    return config, load_keys(config)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is on the loopback interface only."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname that resolves elsewhere, or a wildcard such as "*"


def check_bind(host: str, what: str, keys: ClusterKeys | None, config: SecurityConfig) -> None:
    """Refuse to listen on a non-loopback ``host`` without a cluster secret, unless the config
    says ``insecure_no_auth``; then warn (at every start)."""
    if keys is not None or is_loopback(host):
        return
    if not config.insecure_no_auth:
        raise ConfigError(
            f"{what} would listen on {host!r} without authentication: set "
            "security.cluster_secret_file (KVSTACK_SECURITY_CLUSTER_SECRET_FILE), bind "
            "127.0.0.1, or set security.insecure_no_auth: true to accept the risk"
        )
    log.warning(
        "%s listens on %s WITHOUT authentication (security.insecure_no_auth): anyone who can "
        "reach it can read and write the cluster's KV",
        what,
        host,
    )


def write_secret_file(path: str | Path, num_bytes: int = MIN_SECRET_BYTES) -> Path:
    """Create a new random secret file with mode 0600 from the start (never chmod'ed after)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(os.urandom(num_bytes).hex().encode())
    return target


def _read_secret(path: str, key: str) -> bytes:
    try:
        info = os.stat(path)
        raw = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path!r}: {exc.strerror}") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO) and stat.S_ISREG(info.st_mode):
        log.warning("%s %s is readable by group or others (mode %o)", key, path, info.st_mode)
    if len(raw) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{key}: {path!r} holds {len(raw)} bytes; a cluster secret needs at least "
            f"{MIN_SECRET_BYTES} (create one with `kvstack security init-secret PATH`)"
        )
    return raw


def _derive(secret: bytes, purpose: str) -> bytes:
    if purpose not in PURPOSES and purpose != "fingerprint":
        raise ValueError(f"unknown key purpose {purpose!r}; known: {sorted(PURPOSES)}")
    root = hashlib.blake2b(secret, person=b"kvstack-secret").digest()  # any length -> 64 bytes
    person = purpose.encode()[:16]
    return hashlib.blake2b(b"kvstack-cluster-key", key=root, person=person).digest()[:32]


def _mac(key: bytes, parts: tuple[bytes, ...], size: int) -> bytes:
    h = hashlib.blake2b(key=key, digest_size=size)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()
