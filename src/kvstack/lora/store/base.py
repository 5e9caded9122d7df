"""The artifact store interface: adapter files addressed by their manifest digest.

Layout under a store's root: ``<digest>/manifest.json``, ``<digest>/adapter_config.json``,
``<digest>/adapter_model.safetensors``. A digest names exactly one content, so ``put`` is
idempotent and an artifact is never overwritten; ``fetch`` copies the files a stored manifest
names into a local directory, and the verifier then re-hashes them against the registry.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from kvstack.errors import VerificationError
from kvstack.lora.manifest import Manifest

__all__ = ["ArtifactRef", "ArtifactStore", "parse_digest"]

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    uri: str
    sha256: str
    size_bytes: int


def parse_digest(uri: str, prefix: str) -> str:
    """The digest of an artifact URI of this store; refuses foreign URIs and traversal."""
    if not uri.startswith(prefix):
        raise VerificationError("foreign_uri", f"{uri!r} is not in this store ({prefix})")
    digest = uri[len(prefix) :].strip("/")
    if not _DIGEST_RE.match(digest):
        raise VerificationError("path_traversal", f"{uri!r} does not end in a sha256 digest")
    return digest


class ArtifactStore(ABC):
    """Where verified adapter artifacts live, by digest."""

    prefix: str  # URIs of this store start with it

    @abstractmethod
    def put(self, source: Path, manifest: Manifest) -> ArtifactRef:
        """Store the adapter files in ``source`` under the manifest's digest (idempotent)."""

    @abstractmethod
    def fetch(self, uri: str, dest: Path, max_bytes: int) -> Manifest:
        """Copy the artifact's files into ``dest`` (created); refuses files over ``max_bytes``
        in total. Returns the stored manifest (untrusted until the verifier re-hashes)."""

    @abstractmethod
    def contains(self, digest: str) -> bool:
        """Whether the artifact with this digest is stored."""

    def uri_for(self, digest: str) -> str:
        return f"{self.prefix.rstrip('/')}/{digest}"
