"""Offline Ed25519 signatures over adapter artifacts.

The signed message (format ``v2``) binds the artifact's manifest digest to its adapter id,
version, tenant, base model and base-model revision, so a signed artifact cannot be
re-registered under another name, for another tenant, or for another base model or revision.
Each field is length-prefixed, so no field value can shift bytes into its neighbour. Keys are
PEM files; a key's id is the first 16 hex digits of the sha256 of its raw public bytes.

A stored signature is ``v2:<base64>``. Signatures of format ``v1`` (bare base64, covering
adapter id, version, base model and digest only) are refused with a message saying how to
re-sign: accepting them would keep open exactly what ``v2`` closes (a version signed for one
tenant served as another's), and re-signing is one offline command for whoever holds the key.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kvstack.errors import ConfigError, VerificationError, require

require("cryptography", "lora")

from cryptography.exceptions import InvalidSignature  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: E402
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from kvstack.lora.adapters import AdapterVersion  # noqa: E402

__all__ = [
    "SIGNATURE_FORMAT",
    "Signature",
    "TrustedKeys",
    "generate_keypair",
    "key_id",
    "sign",
    "signing_message",
]

SIGNATURE_FORMAT = "v2"


@dataclass(frozen=True, slots=True)
class Signature:
    signer: str  # key id
    value: str  # "v2:" + base64


def signing_message(adapter: AdapterVersion) -> bytes:
    """What a ``v2`` signature signs: every field that decides where and for whom the
    artifact may be served, each as ``<length>:<value>``."""
    fields = (
        adapter.adapter_id,
        adapter.version,
        adapter.tenant_id,
        adapter.base_model,
        adapter.base_model_revision,
        adapter.sha256,
    )
    body = "".join(f"{len(f.encode())}:{f}\n" for f in fields)
    return f"kvstack-lora-{SIGNATURE_FORMAT}\n{body}".encode()


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_keypair(private_path: Path, public_path: Path) -> str:
    """Write a new key pair as PEM files and return the key id. The private key file is
    created with mode 0600 (never readable by others, not even between a write and a chmod);
    existing files are never overwritten (a ConfigError names them)."""
    private = Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = private.public_key()
    public_pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    for path in (private_path, public_path):
        if path.exists():
            raise ConfigError(f"{path} exists; keygen never overwrites a key")
    _create(private_path, private_pem, 0o600)
    _create(public_path, public_pem, 0o644)
    return key_id(public)


def _create(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise ConfigError(f"{path} exists; keygen never overwrites a key") from None
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def sign(private_key_path: Path, adapter: AdapterVersion) -> Signature:
    key = serialization.load_pem_private_key(private_key_path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise VerificationError("bad_key", f"{private_key_path} is not an Ed25519 private key")
    value = base64.b64encode(key.sign(signing_message(adapter))).decode()
    return Signature(key_id(key.public_key()), f"{SIGNATURE_FORMAT}:{value}")


class TrustedKeys:
    """The public keys allowed to sign adapters, by key id."""

    def __init__(self, keys: Iterable[Ed25519PublicKey] = ()) -> None:
        self._keys = {key_id(k): k for k in keys}

    @classmethod
    def load(cls, paths: Iterable[str | Path]) -> TrustedKeys:
        keys = []
        for path in paths:
            try:
                key = serialization.load_pem_public_key(Path(path).expanduser().read_bytes())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"lora.trusted_keys: cannot load {str(path)!r}: {exc}") from None
            if not isinstance(key, Ed25519PublicKey):
                raise ConfigError(f"lora.trusted_keys: {str(path)!r} is not an Ed25519 public key")
            keys.append(key)
        return cls(keys)

    def __len__(self) -> int:
        return len(self._keys)

    def verify(self, adapter: AdapterVersion) -> None:
        """Raise :class:`VerificationError` unless a trusted key signed exactly this artifact."""
        if not adapter.signature:
            raise VerificationError("unsigned", f"{adapter.engine_name} has no signature")
        form, sep, value = adapter.signature.partition(":")
        if not sep or form != SIGNATURE_FORMAT:
            raise VerificationError(
                "old_signature_format",
                f"{adapter.engine_name} carries a signature of format {form if sep else 'v1'}, "
                f"which does not cover the tenant and the base-model revision; re-sign it: "
                f"kvstack adapters sign {adapter.engine_name} --key PRIVATE_KEY.pem",
            )
        key = self._keys.get(adapter.signer)
        if key is None:
            raise VerificationError("unknown_signer", f"key {adapter.signer!r} is not trusted")
        try:
            key.verify(base64.b64decode(value, validate=True), signing_message(adapter))
        except (InvalidSignature, ValueError):
            raise VerificationError(
                "bad_signature", f"signature of {adapter.engine_name} does not verify"
            ) from None
