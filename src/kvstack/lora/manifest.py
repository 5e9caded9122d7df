"""The manifest of an adapter artifact: its files with their sha256 and size.

An artifact's identity (the registry's ``sha256``, the store's address) is the sha256 of the
manifest's canonical JSON, so one digest covers every byte of every file, and a signature over
that digest covers the whole artifact.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from kvstack.errors import VerificationError

__all__ = ["ADAPTER_FILES", "FileDigest", "Manifest", "sha256_file"]

# The only files an artifact holds: PEFT's config and its safetensors weights.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
_BLOCK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class FileDigest:
    name: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class Manifest:
    files: tuple[FileDigest, ...]

    @classmethod
    def of_dir(cls, path: Path) -> Manifest:
        """Hash the adapter files in ``path`` (both must exist)."""
        files = []
        for name in ADAPTER_FILES:
            file = path / name
            if not file.is_file():
                raise VerificationError("missing_file", f"{name} is missing")
            files.append(FileDigest(name, sha256_file(file), file.stat().st_size))
        return cls(tuple(files))

    @classmethod
    def parse(cls, raw: bytes) -> Manifest:
        """Parse a stored manifest; names must be exactly the adapter files."""
        try:
            data = json.loads(raw)
            files = tuple(
                FileDigest(str(f["name"]), str(f["sha256"]), int(f["size_bytes"]))
                for f in data["files"]
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise VerificationError("bad_manifest", f"cannot parse manifest: {exc}") from None
        if tuple(f.name for f in files) != ADAPTER_FILES:
            names = [f.name for f in files]
            raise VerificationError("unexpected_file", f"manifest lists {names}")
        return cls(files)

    def canonical_bytes(self) -> bytes:
        files = [
            {"name": f.name, "sha256": f.sha256, "size_bytes": f.size_bytes} for f in self.files
        ]
        return json.dumps({"files": files}, sort_keys=True, separators=(",", ":")).encode()

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.canonical_bytes()).hexdigest()

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)
