"""Records of the adapter registry: one :class:`AdapterVersion` per published version and one
:class:`Release` per adapter (which version is stable, which is in canary, where to roll back).

Engine-side names are ``adapter_id@version``: a new version is always a new name on the engine,
so vLLM never reloads changed weights under a name it has cached (its stale-version pitfall),
and a request keeps the exact version it was routed with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum

from kvstack.errors import RegistryError

__all__ = [
    "AdapterVersion",
    "Release",
    "Status",
    "check_name",
    "engine_name",
    "split_engine_name",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class Status(str, Enum):
    ACTIVE = "active"  # the stable version of its adapter
    CANARY = "canary"  # takes canary_percent of the traffic
    STAGED = "staged"  # registered, verified, not serving unless pinned by name
    DEPRECATED = "deprecated"  # a former stable version; kept for rollback and pinned requests
    DISABLED = "disabled"  # never served or loaded again


def check_name(value: str, what: str) -> str:
    """Adapter ids and versions are path- and label-safe: letters, digits, '.', '_', '-'."""
    if not _NAME_RE.match(value) or value in (".", ".."):
        raise RegistryError(
            f"{what} {value!r} is invalid: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return value


def engine_name(adapter_id: str, version: str) -> str:
    return f"{adapter_id}@{version}"


def split_engine_name(name: str) -> tuple[str, str] | None:
    """``"a@v2"`` -> ``("a", "v2")``; None when ``name`` is not an engine-side adapter name."""
    adapter_id, sep, version = name.partition("@")
    if not sep or not _NAME_RE.match(adapter_id) or not _NAME_RE.match(version):
        return None
    return adapter_id, version


@dataclass(frozen=True, slots=True)
class AdapterVersion:
    adapter_id: str
    version: str
    base_model: str
    rank: int
    alpha: float
    artifact_uri: str
    sha256: str  # digest of the artifact's manifest of file digests
    size_bytes: int
    tenant_id: str
    priority_tier: str
    target_modules: tuple[str, ...]
    status: Status = Status.STAGED
    base_model_revision: str = ""
    tokenizer_revision: str = ""
    format: str = "peft-safetensors"
    signature: str = ""  # base64 Ed25519 signature of the signing message
    signer: str = ""  # key id of the signing key
    created_at: float = 0.0
    source_uri: str = ""

    @property
    def engine_name(self) -> str:
        return engine_name(self.adapter_id, self.version)

    def with_status(self, status: Status) -> AdapterVersion:
        return replace(self, status=status)


@dataclass(frozen=True, slots=True)
class Release:
    """Traffic state of one adapter."""

    adapter_id: str
    stable_version: str | None = None
    canary_version: str | None = None
    canary_percent: float = 0.0
    rollback_to: str | None = None
    updated_at: float = 0.0
