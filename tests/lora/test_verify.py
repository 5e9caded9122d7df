"""Verification: every way an artifact can be wrong is rejected with its reason and audited."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from kvstack.errors import VerificationError
from kvstack.lora.basemodel import BaseModelDims
from kvstack.lora.config import AdapterEngineSpec
from kvstack.lora.plane import ControlPlane
from kvstack.lora.signing import generate_keypair
from tests.lora.adapters import TINY_DIMS, synthetic_adapter

ENGINE = AdapterEngineSpec(url="http://e", base_model="toy", served_model_name="toy", warm_dir="/w")


def register(plane: ControlPlane, src: Path, version: str = "1", **kw: object) -> object:
    args = {
        "adapter_id": "acme-support",
        "version": version,
        "base_model": "toy",
        "tenant_id": "acme",
        "priority_tier": "gold",
        "actor": "test",
    }
    args.update(kw)
    return plane.register(str(src), **args)  # type: ignore[arg-type]


def rejected(plane: ControlPlane, action: str) -> str:
    entry = plane.audit.entries(action=action, limit=1)[0]
    assert entry.decision == "reject"
    return entry.reason


def test_good_adapter_registers_signs_and_verifies(
    plane: ControlPlane, sources: Path, keypair: tuple[Path, Path]
) -> None:
    src = synthetic_adapter(sources / "good")
    (src / "README.md").write_text("trained on support tickets")  # harmless, not copied
    adapter = register(plane, src)
    assert adapter.rank == 8 and adapter.target_modules == ("q_proj", "v_proj")
    assert adapter.status.value == "active" and len(adapter.sha256) == 64
    plane.sign("acme-support", "1", keypair[0], actor="test")
    plane.verify("acme-support", "1", actor="test", engine=ENGINE)
    actions = [(e.action, e.decision) for e in plane.audit.entries(limit=10)]
    assert actions == [("verify", "accept"), ("sign", "accept"), ("register", "accept")]
    assert plane.audit.entries(limit=1)[0].digest == adapter.sha256


def test_tampered_artifact_is_rejected(
    plane: ControlPlane, sources: Path, keypair: tuple[Path, Path]
) -> None:
    adapter = register(plane, synthetic_adapter(sources / "a"))
    plane.sign("acme-support", "1", keypair[0], actor="test")
    stored = Path(plane.store.root) / adapter.sha256 / "adapter_model.safetensors"  # type: ignore[attr-defined]
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF
    stored.write_bytes(bytes(data))
    with pytest.raises(VerificationError) as err:
        plane.verify("acme-support", "1", actor="test", engine=ENGINE)
    assert err.value.reason == "digest_mismatch"
    assert rejected(plane, "verify").startswith("digest_mismatch")


def test_wrong_digest_in_registry_is_rejected(
    plane: ControlPlane, sources: Path, tmp_path: Path
) -> None:
    adapter = register(plane, synthetic_adapter(sources / "a"))
    plane.store.fetch(adapter.artifact_uri, tmp_path / "f", 1 << 30)
    wrong = dataclasses.replace(adapter, sha256="0" * 64)
    with pytest.raises(VerificationError) as err:
        plane.verifier.verify_for_engine(tmp_path / "f", wrong, ENGINE)
    assert err.value.reason == "digest_mismatch"


def test_signatures_unsigned_foreign_and_forged(
    plane: ControlPlane, sources: Path, tmp_path: Path
) -> None:
    register(plane, synthetic_adapter(sources / "a"))
    with pytest.raises(VerificationError, match="unsigned"):
        plane.verify("acme-support", "1", actor="test", engine=ENGINE)
    assert rejected(plane, "verify").startswith("unsigned")
    generate_keypair(tmp_path / "other.pem", tmp_path / "other.pub")
    plane.sign("acme-support", "1", tmp_path / "other.pem", actor="mallory")
    with pytest.raises(VerificationError) as err:
        plane.verify("acme-support", "1", actor="test", engine=ENGINE)
    assert err.value.reason == "unknown_signer"
    # A trusted signer's signature copied onto another version does not verify.
    adapter = plane.registry.get("acme-support", "1")
    trusted = next(iter(plane.verifier.trusted._keys))
    forged = dataclasses.replace(adapter, signer=trusted, version="2")
    with pytest.raises(VerificationError) as err:
        plane.verifier.trusted.verify(forged)
    assert err.value.reason == "bad_signature"


def test_the_signature_covers_tenant_and_base_model_revision(
    plane: ControlPlane, sources: Path, keypair: tuple[Path, Path]
) -> None:
    """The finding: signatures did not cover the tenant or the base-model revision, so a
    version signed for one tenant verified as another's."""
    register(plane, synthetic_adapter(sources / "a"), base_model_revision="r1")
    signed = plane.sign("acme-support", "1", keypair[0], actor="test")
    assert signed.signature.startswith("v2:")
    plane.verifier.trusted.verify(signed)
    for change in ({"tenant_id": "globex"}, {"base_model_revision": "r2"},
                   {"adapter_id": "acme-sales"}, {"base_model": "other"}):  # fmt: skip
        with pytest.raises(VerificationError) as err:
            plane.verifier.trusted.verify(dataclasses.replace(signed, **change))
        assert err.value.reason == "bad_signature", change


def test_wrong_base_model_is_rejected(plane: ControlPlane, sources: Path) -> None:
    other = dataclasses.replace(TINY_DIMS, name="wide", hidden_size=256, head_dim=128)
    with pytest.raises(VerificationError) as err:
        register(plane, synthetic_adapter(sources / "w", base=other))
    assert err.value.reason == "shape_mismatch"
    assert "shape" in rejected(plane, "register")
    adapter = register(plane, synthetic_adapter(sources / "a"))
    with pytest.raises(VerificationError) as err:
        plane.verifier.check_compatible(adapter, ENGINE.model_copy(update={"base_model": "x"}))
    assert err.value.reason == "base_model_mismatch"


def test_oversized_rank_is_rejected(
    plane: ControlPlane, sources: Path, keypair: tuple[Path, Path]
) -> None:
    register(plane, synthetic_adapter(sources / "r64", rank=64))
    plane.sign("acme-support", "1", keypair[0], actor="test")
    with pytest.raises(VerificationError) as err:
        plane.verify("acme-support", "1", actor="test", engine=ENGINE)  # max_lora_rank 16
    assert err.value.reason == "rank_exceeds_engine"
    # Declared rank 8 but matrices of rank 512: more bytes than rank 8 allows.
    with pytest.raises(VerificationError) as err:
        register(plane, synthetic_adapter(sources / "fat", rank=8, shape_rank=512), version="2")
    assert err.value.reason == "too_large"


def test_pickle_file_is_rejected(plane: ControlPlane, sources: Path) -> None:
    src = synthetic_adapter(sources / "p")
    (src / "adapter_model.bin").write_bytes(pickle.dumps({"w": [1, 2, 3]}))
    with pytest.raises(VerificationError) as err:
        register(plane, src)
    assert err.value.reason == "pickle_file"
    (src / "adapter_model.bin").unlink()
    (src / "notes.txt").write_bytes(pickle.dumps("disguised"))
    with pytest.raises(VerificationError) as err:
        register(plane, src)
    assert err.value.reason == "pickle_file"
    assert rejected(plane, "register").startswith("pickle_file")


def test_path_traversal_and_allowlist(plane: ControlPlane, sources: Path, tmp_path: Path) -> None:
    synthetic_adapter(tmp_path / "outside")
    for uri in (f"{sources}/../outside", f"file://{sources}/%2e%2e/outside"):
        with pytest.raises(VerificationError) as err:
            register(plane, Path(uri))
        assert err.value.reason == "path_traversal"
    with pytest.raises(VerificationError) as err:
        register(plane, tmp_path / "outside")
    assert err.value.reason == "source_not_allowed"
    assert rejected(plane, "register").startswith("source_not_allowed")
    with pytest.raises(VerificationError) as err:
        plane.store.fetch(plane.store.prefix + "/../../etc", tmp_path / "x", 1 << 20)
    assert err.value.reason == "path_traversal"


def test_symlink_and_bad_header_are_rejected(plane: ControlPlane, sources: Path) -> None:
    src = synthetic_adapter(sources / "s")
    (src / "README.md").symlink_to("/etc/passwd")
    with pytest.raises(VerificationError) as err:
        register(plane, src)
    assert err.value.reason == "unexpected_file"
    (src / "README.md").unlink()
    weights = src / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])  # truncated
    with pytest.raises(VerificationError) as err:
        register(plane, src)
    assert err.value.reason == "bad_header"


def test_real_peft_adapter_passes(plane: ControlPlane, sources: Path, peft_dir: Path) -> None:
    import shutil

    shutil.copytree(peft_dir, sources / "peft")
    adapter = register(plane, sources / "peft")
    assert adapter.rank == 8 and adapter.target_modules == ("q_proj", "v_proj")


def test_base_dims_from_toy_config(toy_model: Path) -> None:
    dims = BaseModelDims.from_config_dir("toy", toy_model)
    assert dataclasses.replace(dims, name="toy") == TINY_DIMS
