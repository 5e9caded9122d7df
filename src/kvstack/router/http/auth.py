"""Optional API keys: ``Authorization: Bearer KEY``, each key mapped to a tenant.

Keys come from the config (``auth.api_keys``) and from a file of ``KEY [TENANT]`` lines
(``#`` comments), re-read when its modification time changes. Only SHA-256 digests are kept,
so a lookup compares digests, not secrets. With no key configured, auth is off.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping

from kvstack.errors import AuthenticationError, ConfigError
from kvstack.router.config import AuthConfig

__all__ = ["ApiKeys", "parse_keys_file"]

log = logging.getLogger(__name__)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_keys_file(text: str, path: str = "api keys file") -> dict[bytes, str]:
    keys: dict[bytes, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) > 2:
            raise ConfigError(f"{path}:{number}: expected 'KEY [TENANT]', got {len(fields)} fields")
        keys[_digest(fields[0])] = fields[1] if len(fields) == 2 else "default"
    return keys


class ApiKeys:
    def __init__(self, config: AuthConfig) -> None:
        self._static = {_digest(k.key.get_secret_value()): k.tenant for k in config.api_keys}
        self._path = config.api_keys_file
        self._mtime: float | None = None
        self._from_file: dict[bytes, str] = {}
        if self._path is not None:
            self.reload_if_changed()

    @property
    def enabled(self) -> bool:
        return bool(self._static) or self._path is not None

    def reload_if_changed(self) -> None:
        """Re-read the keys file if it changed; keep the old keys if it cannot be read."""
        if self._path is None:
            return
        try:
            mtime = os.stat(self._path).st_mtime
            if mtime == self._mtime:
                return
            with open(self._path, encoding="utf-8") as f:
                self._from_file = parse_keys_file(f.read(), self._path)
            self._mtime = mtime
            log.info("loaded %d API keys from %s", len(self._from_file), self._path)
        except (OSError, ConfigError) as exc:
            if self._mtime is None:
                raise ConfigError(f"cannot load API keys from {self._path!r}: {exc}") from None
            log.warning("keeping the previous API keys; cannot reload %s: %s", self._path, exc)

    def tenant(self, headers: Mapping[str, str]) -> str | None:
        """The tenant of the request's key; None when auth is off; AuthenticationError if bad."""
        if not self.enabled:
            return None
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationError("missing API key; send 'Authorization: Bearer <key>'")
        digest = _digest(token.strip())
        tenant = self._static.get(digest) or self._from_file.get(digest)
        if tenant is None:
            raise AuthenticationError("incorrect API key provided")
        return tenant
