"""The EPP's server credentials: a configured certificate, or one made at start.

GIE's endpoint picker serves TLS by default with a self-signed certificate created when it
starts, and the gateways connect without verifying it (the InferencePool names the EPP's
Service, nothing names a CA). ``tls.self_signed`` does the same here with ``cryptography``:
an ECDSA P-256 key and a certificate valid for a year, kept in memory only. With
``tls.client_ca_file`` the EPP also requires the gateway's client certificate (mutual TLS),
which is how it authenticates its callers without a token.
"""

from __future__ import annotations

import datetime
import socket
from pathlib import Path

import grpc

from kvstack.errors import ConfigError
from kvstack.router.epp.config import EppTLSConfig

__all__ = ["self_signed_pair", "server_credentials"]


def server_credentials(config: EppTLSConfig) -> grpc.ServerCredentials | None:
    """The port's credentials; None when TLS is off."""
    if not config.enabled:
        return None
    if config.cert_file is not None and config.key_file is not None:
        key, cert = _read(config.key_file), _read(config.cert_file)
    else:
        key, cert = self_signed_pair()
    client_ca = _read(config.client_ca_file) if config.client_ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def self_signed_pair(hostname: str | None = None) -> tuple[bytes, bytes]:
    """(private key PEM, certificate PEM) for ``hostname`` (default: this host's name)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    name = hostname or socket.gethostname()
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read TLS file {path!r}: {exc}") from None
