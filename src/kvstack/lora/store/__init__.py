"""Artifact stores by URL scheme (``file://`` and ``s3://``) and fetching registration sources."""

from __future__ import annotations

from pathlib import Path

from kvstack.errors import ConfigError
from kvstack.lora.store.base import ArtifactRef, ArtifactStore, parse_digest
from kvstack.lora.store.sources import fetch_source

__all__ = ["ArtifactRef", "ArtifactStore", "fetch_source", "open_store", "parse_digest"]


def open_store(url: str, s3_endpoint_url: str | None = None) -> ArtifactStore:
    """``file:///dir`` (or ``file://./rel``) or ``s3://bucket/prefix``."""
    if url.startswith("file://"):
        from kvstack.lora.store.dir import DirStore

        return DirStore(Path(url[len("file://") :]))
    if url.startswith("s3://"):
        from kvstack.lora.store.s3 import S3Store

        return S3Store(url, s3_endpoint_url)
    raise ConfigError(f"artifact_store {url!r}: use file:///dir or s3://bucket/prefix")
