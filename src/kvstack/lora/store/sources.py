"""Fetch a registration source (a local directory or an ``s3://`` prefix) into a scratch
directory, copying regular files only and never following links out of the source."""

from __future__ import annotations

import shutil
from pathlib import Path

from kvstack.errors import VerificationError
from kvstack.lora.verify import check_no_traversal

__all__ = ["fetch_source"]

_MAX_SOURCE_FILES = 32


def fetch_source(uri: str, dest: Path, max_bytes: int, s3_endpoint_url: str | None = None) -> None:
    """Copy the source's top-level files into ``dest`` (files are checked afterwards)."""
    check_no_traversal(uri)
    dest.mkdir(parents=True, exist_ok=True)
    if uri.startswith("s3://"):
        _fetch_s3(uri, dest, max_bytes, s3_endpoint_url)
    else:
        _fetch_dir(
            Path(uri[len("file://") :] if uri.startswith("file://") else uri), dest, max_bytes
        )


def _fetch_dir(source: Path, dest: Path, max_bytes: int) -> None:
    if not source.is_dir():
        raise VerificationError("missing_file", f"source {source} is not a directory")
    entries = sorted(source.iterdir())
    if len(entries) > _MAX_SOURCE_FILES:
        raise VerificationError("unexpected_file", f"source holds {len(entries)} entries")
    total = 0
    for entry in entries:
        if entry.is_symlink() or not entry.is_file():
            raise VerificationError("unexpected_file", f"{entry.name} is not a regular file")
        total += entry.stat().st_size
        if total > max_bytes:
            raise VerificationError("too_large", f"source is larger than {max_bytes} bytes")
        shutil.copyfile(entry, dest / entry.name)


def _fetch_s3(uri: str, dest: Path, max_bytes: int, endpoint_url: str | None) -> None:
    from kvstack.lora.store.s3 import s3_client, split_s3_uri

    bucket, prefix = split_s3_uri(uri)
    client = s3_client(endpoint_url)
    listing = client.list_objects_v2(
        Bucket=bucket, Prefix=f"{prefix}/", MaxKeys=_MAX_SOURCE_FILES + 1
    )
    objects = listing.get("Contents", [])
    if len(objects) > _MAX_SOURCE_FILES:
        raise VerificationError("unexpected_file", f"source holds over {_MAX_SOURCE_FILES} objects")
    if sum(int(o["Size"]) for o in objects) > max_bytes:
        raise VerificationError("too_large", f"source is larger than {max_bytes} bytes")
    for obj in objects:
        name = obj["Key"][len(prefix) + 1 :]
        if not name or "/" in name or name in (".", ".."):
            raise VerificationError("unexpected_file", f"{obj['Key']} is not a top-level file")
        client.download_file(bucket, obj["Key"], str(dest / name))
