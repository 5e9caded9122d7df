"""Who may talk to the index service, and as whom: credentials derived from the cluster secret.

- **HTTP** (every route but ``/health``): ``Authorization: Bearer kvs1.<hex>``, a token derived
  from the ``index-http`` key. Anyone without the secret gets 401. The token is the same for
  every member and travels in the clear over ``http://``: across untrusted networks put the
  index behind TLS (``https://`` URLs work as they are).
- **ZMQ**: each request carries a fourth frame ``ts (u64 ms) ‖ nonce (16) ‖ tag (16)``, the
  tag a keyed BLAKE2b of ``ts, nonce, request id, operation, SHA-256(body)`` under the
  ``index-zmq`` key (SHA-256 first: it runs at ~1.5 GB/s with SHA-NI where BLAKE2b runs at
  ~0.6, and lookups carry up to megabytes of tokens). A frame without it, with a wrong tag,
  a timestamp more than ``MAX_SKEW_S`` away or a nonce seen before is refused with 401.
- **Instance identity**: a report names its instance and carries
  ``token = MAC("announce" key; instance id)``; the index refuses (403) a report whose token
  does not match its instance id, so a credential captured for one engine cannot reset or
  announce for another, and no one without the secret can mint one.

During a rotation the current and the previous secret are both accepted.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvstack.security import ClusterKeys

__all__ = [
    "AUTH_FRAME_BYTES",
    "MAX_SKEW_S",
    "FrameChecker",
    "announce_token",
    "bearer_header",
    "check_announce_token",
    "check_bearer",
    "sign_frames",
]

MAX_SKEW_S = 60.0
_PREFIX = "kvs1."
_AUTH = struct.Struct("<Q16s16s")
AUTH_FRAME_BYTES = _AUTH.size
NONCES_KEPT = 1 << 16


def bearer_header(keys: ClusterKeys) -> str:
    """The ``Authorization`` header value members send."""
    return f"Bearer {_PREFIX}{keys.mac('index-http', b'bearer', size=32).hex()}"


def check_bearer(keys: ClusterKeys, header: str | None) -> bool:
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token.startswith(_PREFIX):
        return False
    try:
        tag = bytes.fromhex(token[len(_PREFIX) :])
    except ValueError:
        return False
    return len(tag) == 32 and keys.check("index-http", tag, b"bearer")


def announce_token(keys: ClusterKeys, instance_id: str) -> str:
    """The token that lets a report speak for ``instance_id``."""
    return keys.mac("announce", instance_id.encode()).hex()


def check_announce_token(keys: ClusterKeys, instance_id: str, token: str) -> bool:
    try:
        tag = bytes.fromhex(token)
    except ValueError:
        return False
    return len(tag) == 16 and keys.check("announce", tag, instance_id.encode())


def sign_frames(keys: ClusterKeys, request_id: bytes, operation: bytes, body: bytes) -> bytes:
    """The auth frame for one ZMQ request."""
    ts = int(time.time() * 1000)
    nonce = os.urandom(16)
    return _AUTH.pack(ts, nonce, _frame_tag(keys.key("index-zmq"), ts, nonce, request_id,
                                            operation, body))  # fmt: skip


def _frame_tag(
    key: bytes, ts: int, nonce: bytes, request_id: bytes, operation: bytes, body: bytes
) -> bytes:
    digest = hashlib.sha256(body).digest()
    h = hashlib.blake2b(key=key, digest_size=16)
    for part in (ts.to_bytes(8, "little"), nonce, request_id, operation, digest):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


class FrameChecker:
    """Checks ZMQ auth frames: tag, clock skew, and nonces not seen within the window."""

    def __init__(self, keys: ClusterKeys, max_skew_s: float = MAX_SKEW_S) -> None:
        self.keys = keys
        self.max_skew_s = max_skew_s
        self._seen: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def refusal(self, request_id: bytes, operation: bytes, body: bytes, auth: bytes) -> str | None:
        """None when the frame is genuine and fresh, else why it is refused."""
        if len(auth) != AUTH_FRAME_BYTES:
            return "unsigned request: this index requires the cluster secret (security.*)"
        ts, nonce, tag = _AUTH.unpack(auth)
        now = time.time()
        if abs(now - ts / 1000) > self.max_skew_s:
            return f"request timestamp is more than {self.max_skew_s:g} s off this server's clock"
        tags = (_frame_tag(k, ts, nonce, request_id, operation, body)
                for k in self.keys.verifiers("index-zmq"))  # fmt: skip
        if not any(hmac.compare_digest(tag, t) for t in tags):
            return "forged or damaged request: its MAC does not match the cluster secret"
        return self._replayed(nonce, now)

    def _replayed(self, nonce: bytes, now: float) -> str | None:
        with self._lock:
            while self._seen and next(iter(self._seen.values())) < now - 2 * self.max_skew_s:
                self._seen.popitem(last=False)
            if nonce in self._seen:
                return "replayed request (its nonce was seen before)"
            self._seen[nonce] = now
            if len(self._seen) > NONCES_KEPT:
                self._seen.popitem(last=False)
        return None
