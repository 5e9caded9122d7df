"""``s3://bucket/prefix``: the artifact store in S3 or an S3-compatible service (boto3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvstack.errors import VerificationError, require
from kvstack.lora.manifest import Manifest
from kvstack.lora.store.base import ArtifactRef, ArtifactStore, parse_digest

__all__ = ["S3Store", "s3_client", "split_s3_uri"]


def s3_client(endpoint_url: str | None) -> Any:
    boto3 = require("boto3", "s3")
    return boto3.client("s3", endpoint_url=endpoint_url)  # type: ignore[attr-defined]


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``."""
    if not uri.startswith("s3://"):
        raise VerificationError("foreign_uri", f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise VerificationError("foreign_uri", f"{uri!r} names no bucket")
    return bucket, key.strip("/")


class S3Store(ArtifactStore):
    def __init__(self, uri: str, endpoint_url: str | None = None, client: Any = None) -> None:
        self.bucket, self.key_prefix = split_s3_uri(uri)
        self.prefix = f"s3://{self.bucket}/{self.key_prefix}".rstrip("/")
        self.client = client if client is not None else s3_client(endpoint_url)

    def _key(self, digest: str, name: str) -> str:
        return f"{self.key_prefix}/{digest}/{name}".lstrip("/")

    def put(self, source: Path, manifest: Manifest) -> ArtifactRef:
        digest = manifest.digest
        if not self.contains(digest):
            for f in manifest.files:
                self.client.upload_file(
                    str(source / f.name), self.bucket, self._key(digest, f.name)
                )
            # The manifest goes last: its presence means the artifact is complete.
            self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(digest, "manifest.json"),
                Body=manifest.canonical_bytes(),
            )
        return ArtifactRef(self.uri_for(digest), digest, manifest.size_bytes)

    def fetch(self, uri: str, dest: Path, max_bytes: int) -> Manifest:
        digest = parse_digest(uri, self.prefix)
        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=self._key(digest, "manifest.json"))
        except self.client.exceptions.NoSuchKey:
            raise VerificationError("missing_artifact", f"{uri} is not in the store") from None
        manifest = Manifest.parse(obj["Body"].read())
        total = 0
        for f in manifest.files:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(digest, f.name))
            total += int(head["ContentLength"])
        if total > max_bytes:
            raise VerificationError("too_large", f"{uri}: {total} bytes > {max_bytes}")
        dest.mkdir(parents=True, exist_ok=True)
        for f in manifest.files:
            self.client.download_file(self.bucket, self._key(digest, f.name), str(dest / f.name))
        return manifest

    def contains(self, digest: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(digest, "manifest.json"))
        except self.client.exceptions.ClientError:
            return False
        return True
