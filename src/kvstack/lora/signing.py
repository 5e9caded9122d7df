"""Offline Ed25519 signatures over adapter artifacts.

The signed message binds the artifact's manifest digest to its adapter id, version and base
model, so a signed artifact cannot be re-registered under another name or base model. Keys are
PEM files; a key's id is the first 16 hex digits of the sha256 of its raw public bytes.
"""

from __future__ import annotations

import base64
import hashlib
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

__all__ = ["Signature", "TrustedKeys", "generate_keypair", "key_id", "sign", "signing_message"]


@dataclass(frozen=True, slots=True)
class Signature:
    signer: str  # key id
    value: str  # base64


def signing_message(adapter_id: str, version: str, base_model: str, sha256: str) -> bytes:
    return f"kvstack-lora-v1\n{adapter_id}\n{version}\n{base_model}\n{sha256}\n".encode()


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_keypair(private_path: Path, public_path: Path) -> str:
    """Write a new key pair as PEM files (the private one mode 0600); returns the key id."""
    private = Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    private_path.write_bytes(private_pem)
    private_path.chmod(0o600)
    public = private.public_key()
    public_path.write_bytes(
        public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return key_id(public)


def sign(private_key_path: Path, adapter: AdapterVersion) -> Signature:
    key = serialization.load_pem_private_key(private_key_path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise VerificationError("bad_key", f"{private_key_path} is not an Ed25519 private key")
    message = signing_message(
        adapter.adapter_id, adapter.version, adapter.base_model, adapter.sha256
    )
    value = base64.b64encode(key.sign(message)).decode()
    return Signature(key_id(key.public_key()), value)


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
        key = self._keys.get(adapter.signer)
        if key is None:
            raise VerificationError("unknown_signer", f"key {adapter.signer!r} is not trusted")
        message = signing_message(
            adapter.adapter_id, adapter.version, adapter.base_model, adapter.sha256
        )
        try:
            key.verify(base64.b64decode(adapter.signature, validate=True), message)
        except (InvalidSignature, ValueError):
            raise VerificationError(
                "bad_signature", f"signature of {adapter.engine_name} does not verify"
            ) from None
