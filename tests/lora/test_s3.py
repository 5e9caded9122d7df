"""The S3 artifact store against moto's S3 server on loopback: register from an S3 source,
content-addressed storage, verified fetch into an engine's warm directory, tamper detection."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstack.errors import VerificationError
from kvstack.lora.decision import Action
from kvstack.lora.store.s3 import S3Store
from kvstack.stack.ports import free_port
from tests.lora.adapters import synthetic_adapter
from tests.lora.conftest import Setup

pytestmark = pytest.mark.s3

CREDS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    saved = {k: os.environ.get(k) for k in CREDS}
    os.environ.update(CREDS)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint)


def _upload(client: Any, src: Path, bucket: str, prefix: str) -> str:
    for f in src.iterdir():
        client.upload_file(str(f), bucket, f"{prefix}/{f.name}")
    return f"s3://{bucket}/{prefix}"


async def test_register_from_s3_and_load_verified(
    make_setup: Callable[..., Setup], s3_endpoint: str, tmp_path: Path
) -> None:
    s = make_setup()
    client = _client(s3_endpoint)
    for bucket in ("adapters", "uploads"):
        client.create_bucket(Bucket=bucket)
    store = S3Store("s3://adapters/store", s3_endpoint)
    s.plane.store = store
    s.manager.loader.store = store
    s.plane.config.s3_endpoint_url = s3_endpoint
    s.plane.config.source_allowlist.append("s3://uploads/acme/")
    source = _upload(client, synthetic_adapter(tmp_path / "a"), "uploads", "acme/support-v1")

    adapter = s.plane.register(source, "acme-support", "1", "toy", "acme", "gold", actor="test")
    assert adapter.artifact_uri == f"s3://adapters/store/{adapter.sha256}"
    keys = {o["Key"] for o in client.list_objects_v2(Bucket="adapters")["Contents"]}
    assert keys == {
        f"store/{adapter.sha256}/{n}"
        for n in ("manifest.json", "adapter_config.json", "adapter_model.safetensors")
    }
    again = s.plane.store.put(
        tmp_path / "a", s.plane.verifier.inspect_source(tmp_path / "a", "toy").manifest
    )
    assert again.uri == adapter.artifact_uri  # content-addressed: same bytes, same object

    s.plane.sign(
        "acme-support", "1", Path(s.plane.config.trusted_keys[0]).with_name("signer.pem"), "t"
    )
    s.manager.resolver.refresh()
    d = await s.manager.ensure_hot(
        "http://engine-a", s.manager.resolver.resolve("acme-support"), budget_s=60
    )
    assert (d.action, d.start) == (Action.SERVE, "cold")

    client.put_object(
        Bucket="adapters",
        Key=f"store/{adapter.sha256}/adapter_config.json",
        Body=b'{"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"]}',
    )
    with pytest.raises(VerificationError) as err:
        s.plane.verify("acme-support", "1", actor="test")
    assert err.value.reason == "digest_mismatch"


def test_s3_refuses_foreign_and_traversing_uris(s3_endpoint: str, tmp_path: Path) -> None:
    _client(s3_endpoint).create_bucket(Bucket="store2")
    store = S3Store("s3://store2/p", s3_endpoint)
    for uri, reason in (
        ("s3://other/p/" + "a" * 64, "foreign_uri"),
        ("s3://store2/p/../x", "path_traversal"),
    ):
        with pytest.raises(VerificationError) as err:
            store.fetch(uri, tmp_path / "x", 1 << 20)
        assert err.value.reason == reason
    with pytest.raises(VerificationError) as err:
        store.fetch("s3://store2/p/" + "b" * 64, tmp_path / "x", 1 << 20)
    assert err.value.reason == "missing_artifact"
