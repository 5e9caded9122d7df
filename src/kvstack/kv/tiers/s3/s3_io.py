"""Chunk objects on S3: ranged parallel reads into caller buffers, single or multipart writes.

An object is the chunk format (96-byte header + payload). A read fetches the first
``part_bytes`` (header included) and, for larger objects, the remaining ranges in parallel,
each received with ``readinto`` at its offset in the destination. A write sends header and
payload through a file-like view over both (no concatenated copy); objects above the multipart
threshold are uploaded in parts.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

from kvstack.errors import ChunkFormatError, require
from kvstack.kv.tiers.remote.codec import HEADER_BYTES, EncodedChunk
from kvstack.kv.tiers.s3.s3_url import S3Options

__all__ = [
    "SegmentReader",
    "first_part_bytes",
    "is_missing",
    "make_client",
    "ranged_read",
    "read_body_into",
    "total_size",
    "upload",
]

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


class SegmentReader(io.RawIOBase):
    """A seekable, read-only file over the concatenation of ``segments[start:end]``."""

    def __init__(self, segments: Sequence[bytes | memoryview], start: int = 0, end: int = -1):
        self._segments = [memoryview(s).cast("B") for s in segments]
        total = sum(len(s) for s in self._segments)
        self._start, self._end = start, total if end < 0 else end
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._end - self._start}
        self._pos = max(0, base[whence] + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        absolute = self._start + self._pos
        want = min(len(out), self._end - absolute)
        done = 0
        offset = 0
        for segment in self._segments:
            if done >= want:
                break
            seg_end = offset + len(segment)
            if absolute + done < seg_end:
                lo = absolute + done - offset
                take = min(want - done, len(segment) - lo)
                out[done : done + take] = segment[lo : lo + take]
                done += take
            offset = seg_end
        self._pos += done
        return done

    def __len__(self) -> int:
        return self._end - self._start


def read_body_into(body: Any, view: memoryview) -> None:
    """Fill ``view`` from a botocore StreamingBody; ChunkFormatError if it ends early."""
    got = 0
    while got < len(view):
        n = body.readinto(view[got:])
        if not n:
            raise ChunkFormatError(f"object ended after {got} of {len(view)} bytes")
        got += n


def total_size(response: dict[str, Any]) -> int:
    """The object's full size from a ranged GET's Content-Range (or its length)."""
    match = _CONTENT_RANGE.match(response.get("ContentRange") or "")
    return int(match.group(3)) if match else int(response["ContentLength"])


def ranged_read(
    client: Any,
    bucket: str,
    name: str,
    view: memoryview,
    offset: int,
    part_bytes: int,
    pool: Executor,
) -> None:
    """Fetch bytes ``[offset, offset + len(view))`` of the object into ``view``, one ranged GET
    per ``part_bytes`` in parallel."""
    futures = []
    for lo in range(0, len(view), part_bytes):
        hi = min(lo + part_bytes, len(view))
        futures.append(pool.submit(_fetch_range, client, bucket, name, view[lo:hi], offset + lo))
    for future in futures:
        future.result()


def _fetch_range(client: Any, bucket: str, name: str, view: memoryview, offset: int) -> None:
    end = offset + len(view) - 1
    response = client.get_object(Bucket=bucket, Key=name, Range=f"bytes={offset}-{end}")
    read_body_into(response["Body"], view)


def upload(
    client: Any, bucket: str, name: str, chunk: EncodedChunk, threshold: int, part_bytes: int
) -> None:
    """Store one encoded chunk as an object (multipart above ``threshold`` bytes)."""
    segments = (chunk.header, chunk.payload)
    if chunk.num_bytes <= threshold:
        body = SegmentReader(segments)
        client.put_object(Bucket=bucket, Key=name, Body=body, ContentLength=len(body))
        return
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=name)["UploadId"]
    try:
        parts = []
        for number, lo in enumerate(range(0, chunk.num_bytes, part_bytes), start=1):
            body = SegmentReader(segments, lo, min(lo + part_bytes, chunk.num_bytes))
            etag = client.upload_part(
                Bucket=bucket, Key=name, UploadId=upload_id, PartNumber=number, Body=body,
                ContentLength=len(body),
            )["ETag"]  # fmt: skip
            parts.append({"ETag": etag, "PartNumber": number})
        client.complete_multipart_upload(
            Bucket=bucket, Key=name, UploadId=upload_id, MultipartUpload={"Parts": parts}
        )
    except BaseException:
        with contextlib.suppress(Exception):  # best effort; the original error matters
            client.abort_multipart_upload(Bucket=bucket, Key=name, UploadId=upload_id)
        raise


def first_part_bytes(part_bytes: int) -> int:
    """The first ranged GET covers the header plus the first part of the payload."""
    return max(part_bytes, HEADER_BYTES)


_MISSING = ("404", "NoSuchKey", "NotFound")


def is_missing(exc: BaseException) -> bool:
    """Whether a botocore error says the object (or bucket) does not exist."""
    response = getattr(exc, "response", None)
    code = str((response or {}).get("Error", {}).get("Code", ""))
    return code in _MISSING


def make_client(options: S3Options) -> Any:
    boto3: Any = require("boto3", "s3")
    botocore_config: Any = require("botocore.config", "s3")
    config = botocore_config.Config(
        connect_timeout=options.connect_timeout_s,
        read_timeout=options.timeout_s,
        retries={"max_attempts": 1, "mode": "standard"},  # the breaker decides about retries
        max_pool_connections=options.threads * 3,
        s3={"addressing_style": options.addressing_style},
        # The chunk format's XXH3 covers the bytes end to end; botocore's CRCs would be a
        # second pass over every payload.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    session = boto3.session.Session(profile_name=options.profile, region_name=options.region)
    return session.client("s3", endpoint_url=options.endpoint_url, config=config)
