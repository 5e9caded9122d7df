"""``s3://bucket/prefix`` tier URLs → options.

Parameters: ``endpoint_url`` (MinIO, Ceph, moto…; default AWS), ``region``, ``profile``,
``addressing_style`` (``path`` | ``virtual`` | ``auto``), ``threads`` (parallel requests),
``part_size`` (ranged reads and multipart uploads), ``multipart_threshold``,
``timeout_s``, ``connect_timeout_s``, ``create_bucket`` (for tests and scratch setups), and the
queue, breaker and compression settings shared by remote tiers. Credentials come from boto3's
usual chain (environment, profile, instance role), never from the URL.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstack.errors import ConfigError
from kvstack.kv.tiers.base import TierURL
from kvstack.kv.tiers.remote.options import (
    pop_bool,
    pop_compression,
    pop_float,
    pop_int,
    pop_size,
)

__all__ = ["S3Options", "parse_s3_url"]

MIN_PART_BYTES = 5 * 1024 * 1024  # S3's minimum multipart part (all but the last)


@dataclass(frozen=True)
class S3Options:
    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    addressing_style: str = "auto"
    threads: int = 8
    part_bytes: int = 8 * 1024 * 1024
    multipart_threshold: int = 16 * 1024 * 1024
    timeout_s: float = 10.0
    connect_timeout_s: float = 2.0
    create_bucket: bool = False
    compression: str = "none"
    queue_chunks: int = 64
    queue_bytes: int = 1 << 30
    breaker_failures: int = 3
    breaker_reset_s: float = 5.0

    @property
    def location(self) -> str:
        endpoint = self.endpoint_url or "aws"
        return f"s3://{self.bucket}/{self.prefix}@{endpoint}"

    def object_key(self, hex_key: str) -> str:
        return f"{self.prefix}/{hex_key}" if self.prefix else hex_key


def parse_s3_url(url: TierURL) -> S3Options:
    bucket = url.netloc
    if not bucket:
        raise ConfigError(f"s3 tier URL {url.url!r} names no bucket, e.g. s3://my-bucket/kv")
    style = url.pop("addressing_style") or "auto"
    if style not in ("auto", "path", "virtual"):
        raise ConfigError(f"addressing_style={style!r} in {url.url!r}: use auto, path or virtual")
    part_bytes = pop_size(url, "part_size", "8MiB")
    if part_bytes < MIN_PART_BYTES:
        raise ConfigError(f"part_size in {url.url!r} must be >= 5MiB (S3's minimum part)")
    options = S3Options(
        bucket=bucket,
        prefix=url.path.strip("/"),
        endpoint_url=url.pop("endpoint_url") or None,
        region=url.pop("region") or None,
        profile=url.pop("profile") or None,
        addressing_style=style,
        threads=pop_int(url, "threads", 8, 1),
        part_bytes=part_bytes,
        multipart_threshold=pop_size(url, "multipart_threshold", "16MiB"),
        timeout_s=pop_float(url, "timeout_s", 10.0, 0.001),
        connect_timeout_s=pop_float(url, "connect_timeout_s", 2.0, 0.001),
        create_bucket=pop_bool(url, "create_bucket", False),
        compression=pop_compression(url),
        queue_chunks=pop_int(url, "queue", 64, 1),
        queue_bytes=pop_size(url, "queue_bytes", "1GiB"),
        breaker_failures=pop_int(url, "breaker_failures", 3, 1),
        breaker_reset_s=pop_float(url, "breaker_reset_s", 5.0, 0.001),
    )
    url.reject_unknown()
    return options
