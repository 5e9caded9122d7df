"""``file:///var/kv?size=100GiB&fsync=false&queue=64&queue_size=1GiB&compression=none&level=1&policy=lru&readers=4``
→ the file tier's settings, each checked with the bad value named."""

from __future__ import annotations

from typing import NamedTuple

from kvstack.errors import ConfigError
from kvstack.kv.format import COMPRESSIONS
from kvstack.kv.tiers.base import TierURL
from kvstack.section import parse_size

__all__ = ["FileOptions", "check_file_options", "parse_file_url"]


class FileOptions(NamedTuple):
    root: str
    capacity_bytes: int
    fsync: bool
    queue_depth: int
    queue_bytes: int
    compression: str
    level: int
    policy: str
    readers: int


def parse_file_url(url: TierURL) -> FileOptions:
    if url.netloc not in ("", "localhost") or not url.path or url.path == "/":
        raise ConfigError(
            f"file tier URL {url.url!r} needs an absolute directory, e.g. file:///var/kv"
        )
    options = FileOptions(
        root=url.path,
        capacity_bytes=parse_size(url.pop("size", "10GiB") or "10GiB", "file tier size"),
        fsync=_truthy(url.pop("fsync", "false")),
        queue_depth=_positive_int(url.pop("queue", "64") or "64", "file tier queue"),
        queue_bytes=parse_size(url.pop("queue_size", "1GiB") or "1GiB", "file tier queue_size"),
        compression=url.pop("compression", "none") or "none",
        level=_positive_int(url.pop("level", "1") or "1", "file tier compression level"),
        policy=url.pop("policy", "lru") or "lru",
        readers=_positive_int(url.pop("readers", "4") or "4", "file tier readers"),
    )
    url.reject_unknown()
    return options


def check_file_options(capacity: int, queue_depth: int, queue_bytes: int, compression: str) -> None:
    if capacity <= 0:
        raise ConfigError(f"file tier size must be > 0 bytes, got {capacity}")
    if queue_depth <= 0 or queue_bytes <= 0:
        raise ConfigError(f"file tier queue bounds must be > 0, got {queue_depth}, {queue_bytes}")
    if compression not in COMPRESSIONS:
        raise ConfigError(f"unknown compression {compression!r}; known: {', '.join(COMPRESSIONS)}")


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes", "on")


def _positive_int(text: str, what: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise ConfigError(f"{what} must be a positive integer, got {text!r}")
    return int(text)
