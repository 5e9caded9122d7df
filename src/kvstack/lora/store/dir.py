"""``file:///root``: the artifact store in a local (or network-mounted) directory."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from kvstack.errors import VerificationError
from kvstack.lora.manifest import Manifest
from kvstack.lora.store.base import ArtifactRef, ArtifactStore, parse_digest

__all__ = ["DirStore"]


class DirStore(ArtifactStore):
    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        self.prefix = self.root.as_uri()

    def put(self, source: Path, manifest: Manifest) -> ArtifactRef:
        digest = manifest.digest
        target = self.root / digest
        if not target.exists():
            tmp = self.root / f".{digest}.{uuid.uuid4().hex}.tmp"
            tmp.mkdir()
            for f in manifest.files:
                shutil.copyfile(source / f.name, tmp / f.name)
            (tmp / "manifest.json").write_bytes(manifest.canonical_bytes())
            try:
                os.rename(tmp, target)
            except OSError:  # stored concurrently by another writer: same content
                shutil.rmtree(tmp, ignore_errors=True)
        return ArtifactRef(self.uri_for(digest), digest, manifest.size_bytes)

    def fetch(self, uri: str, dest: Path, max_bytes: int) -> Manifest:
        folder = self.root / parse_digest(uri, self.prefix)
        try:
            manifest = Manifest.parse((folder / "manifest.json").read_bytes())
        except FileNotFoundError:
            raise VerificationError("missing_artifact", f"{uri} is not in the store") from None
        total = sum((folder / f.name).stat().st_size for f in manifest.files)
        if total > max_bytes:
            raise VerificationError("too_large", f"{uri}: {total} bytes > {max_bytes}")
        dest.mkdir(parents=True, exist_ok=True)
        for f in manifest.files:
            shutil.copyfile(folder / f.name, dest / f.name)
        return manifest

    def contains(self, digest: str) -> bool:
        return (self.root / digest / "manifest.json").is_file()
