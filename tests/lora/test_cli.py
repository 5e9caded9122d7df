"""``kvstack adapters``: the whole release cycle from a shell, configured by environment."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvstack.lora.cli import run
from tests.lora.adapters import TINY_DIMS, synthetic_adapter


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": TINY_DIMS.hidden_size,
                "intermediate_size": TINY_DIMS.intermediate_size,
                "num_hidden_layers": TINY_DIMS.num_layers,
                "num_attention_heads": TINY_DIMS.num_heads,
                "num_key_value_heads": TINY_DIMS.num_kv_heads,
                "head_dim": TINY_DIMS.head_dim,
            }
        )
    )
    (tmp_path / "sources").mkdir()
    values = {
        "KVSTACK_LORA_REGISTRY_URL": f"sqlite:///{tmp_path / 'reg.db'}",
        "KVSTACK_LORA_ARTIFACT_STORE": f"file://{tmp_path / 'store'}",
        "KVSTACK_LORA_SOURCE_ALLOWLIST": json.dumps([(tmp_path / "sources").as_uri() + "/"]),
        "KVSTACK_LORA_TRUSTED_KEYS": json.dumps([str(tmp_path / "keys" / "signing-key.pub.pem")]),
        "KVSTACK_LORA_BASE_MODELS": json.dumps({"toy": {"path": str(base)}}),
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def test_release_cycle(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def cli(*argv: str) -> str:
        assert run("adapters", list(argv)) == 0, capsys.readouterr().err
        return capsys.readouterr().out

    assert "signing-key.pem" in cli("keygen", "--out", str(tmp_path / "keys"))
    for version, seed in (("v1", 1), ("v2", 2)):
        src = synthetic_adapter(tmp_path / "sources" / version, seed=seed)
        out = cli(
            "register",
            str(src),
            "--id",
            "acme-support",
            "--version",
            version,
            "--base-model",
            "toy",
            "--tenant",
            "acme",
            "--tier",
            "gold",
        )
        assert out.startswith(f"registered acme-support@{version}")
        if version == "v1":  # active, but the registry requires a signature to serve it
            assert "(active, unsigned: not served until signed" in out
        cli("sign", f"acme-support@{version}", "--key", str(tmp_path / "keys" / "signing-key.pem"))
    assert "verified acme-support@v2" in cli("verify", "acme-support@v2")
    listing = cli("list")
    assert "acme-support@v1" in listing and "active" in listing and "staged" in listing
    assert cli("canary", "acme-support@v2", "--percent", "25").startswith(
        "canary: acme-support: stable v1, canary v2 at 25% (updated 20"
    )
    assert json.loads(cli("promote", "acme-support@v2", "--json"))["stable_version"] == "v2"
    rolled = cli("rollback", "acme-support")
    assert rolled.startswith("rolled back: acme-support: stable v1"), rolled
    disabled = json.loads(cli("disable", "acme-support@v2", "--json"))
    assert (disabled["stable_version"], disabled["canary_version"]) == ("v1", None)
    assert re.fullmatch(ISO, disabled["updated_at"])
    shown = json.loads(cli("show", "acme-support", "--json"))
    assert [v["status"] for v in shown["versions"]] == ["active", "disabled"]
    assert shown["release"]["stable_version"] == "v1"
    assert re.search(rf"acme-support@v1 .* {ISO}", listing)
    audit = cli("audit", "acme-support")
    assert re.match(rf"{ISO} ", audit)  # ISO-8601, not epoch
    for action in ("register", "sign", "verify", "canary", "promote", "rollback", "disable"):
        assert action in audit


ISO = r"20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def test_every_verb_prints_text_by_default_and_one_json_document_with_json(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Text for people (a line, or a table with ISO-8601 times); ``--json``: the same facts as
    one JSON document, the only thing on stdout."""

    def both(*argv: str) -> tuple[str, Any]:
        assert run("adapters", list(argv)) == 0, capsys.readouterr().err
        text = capsys.readouterr().out
        assert run("adapters", [*argv, "--json"]) == 0, capsys.readouterr().err
        return text, json.loads(capsys.readouterr().out)

    keys = tmp_path / "keys"
    assert run("adapters", ["keygen", "--out", str(keys), "--json"]) == 0
    key = json.loads(capsys.readouterr().out)
    assert key["private_key"] == str(keys / "signing-key.pem") and key["key_id"]
    src = synthetic_adapter(tmp_path / "sources" / "1", seed=1)
    assert run("adapters", [*_register_args(src, "1"), "--json"]) == 0
    registered = json.loads(capsys.readouterr().out)
    assert (registered["engine_name"], registered["status"], registered["served"]) == (
        "bot@1",
        "active",
        False,  # unsigned: not served until signed
    )
    assert re.fullmatch(ISO, registered["created_at"])
    signed = json.loads(_out(capsys, "sign", "bot@1", "--key", key["private_key"], "--json"))
    assert signed["signer"] == key["key_id"] and signed["signature"]
    text, verified = both("verify", "bot@1")
    assert text.startswith("verified bot@1:") and verified["sha256"] == registered["sha256"]
    text, listed = both("list")
    assert re.search(rf"^bot@1 +active +acme +gold .* yes +{ISO}$", text, re.M)
    assert [v["engine_name"] for v in listed["versions"]] == ["bot@1"]
    text, shown = both("show", "bot")
    assert text.splitlines()[0].startswith("bot: stable 1 (updated 20")
    assert "bot@1" in text and shown["release"]["stable_version"] == "1"
    text, audit = both("audit", "bot", "--limit", "2")
    assert len(text.splitlines()) == len(audit["entries"]) == 2
    newest = audit["entries"][0]
    assert newest["action"] == "verify" and re.fullmatch(ISO, newest["ts"])


def _out(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert run("adapters", list(argv)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_rejections_name_the_reason(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = synthetic_adapter(tmp_path / "elsewhere")
    register = [
        "register",
        str(src),
        "--id",
        "x",
        "--version",
        "1",
        "--base-model",
        "toy",
        "--tenant",
        "t",
        "--tier",
        "gold",
    ]
    assert run("adapters", register) == 1  # the trusted key file does not exist yet
    assert "lora.trusted_keys: cannot load" in capsys.readouterr().err
    assert run("adapters", ["keygen", "--out", str(tmp_path / "keys")]) == 0
    capsys.readouterr()
    code = run(
        "adapters",
        [
            "register",
            str(src),
            "--id",
            "x",
            "--version",
            "1",
            "--base-model",
            "toy",
            "--tenant",
            "t",
            "--tier",
            "gold",
        ],
    )
    assert code == 1 and "source_not_allowed" in capsys.readouterr().err
    assert run("adapters", ["promote", "nope"]) == 1
    assert "not ID@VERSION" in capsys.readouterr().err


def test_kvstack_command_dispatches(env: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvstack", "adapters", "list"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ADAPTER@VERSION")


def _register_args(src: Path, version: str) -> list[str]:
    return ["register", str(src), "--id", "bot", "--version", version, "--base-model", "toy",
            "--tenant", "acme", "--tier", "gold"]  # fmt: skip


def test_promoting_an_unsigned_version_is_refused_and_force_needs_no_trusted_key(
    env: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The finding, tried as a new user would: ``promote`` made an unsigned version stable."""
    keys = tmp_path / "keys"
    assert run("adapters", ["keygen", "--out", str(keys)]) == 0
    for version in ("1", "2"):
        src = synthetic_adapter(tmp_path / "sources" / version, seed=int(version))
        assert run("adapters", _register_args(src, version)) == 0
    assert run("adapters", ["sign", "bot@1", "--key", str(keys / "signing-key.pem")]) == 0
    capsys.readouterr()
    assert run("adapters", ["promote", "bot@2"]) == 1
    err = capsys.readouterr().err
    assert "unsigned" in err and "bot@2" in err
    assert run("adapters", ["canary", "bot@2", "--percent", "10"]) == 1
    assert "unsigned" in capsys.readouterr().err
    assert run("adapters", ["promote", "bot@2", "--force"]) == 1  # a key is trusted: sign it
    assert "--force is refused while lora.trusted_keys" in capsys.readouterr().err
    assert run("adapters", ["sign", "bot@2", "--key", str(keys / "signing-key.pem")]) == 0
    capsys.readouterr()
    assert run("adapters", ["promote", "bot@2"]) == 0
    assert capsys.readouterr().out.startswith("promoted: bot: stable 2, rollback to 1")
    assert run("adapters", ["audit", "bot"]) == 0
    audit = capsys.readouterr().out
    assert "promote" in audit and "reject" in audit and "unsigned" in audit

    # Without a trusted key, --force is the explicit way to release unsigned versions.
    monkeypatch.setenv("KVSTACK_LORA_TRUSTED_KEYS", "[]")
    src = synthetic_adapter(tmp_path / "sources" / "3", seed=3)
    assert run("adapters", _register_args(src, "3")) == 0
    capsys.readouterr()
    assert run("adapters", ["promote", "bot@3"]) == 1
    assert "unsigned" in capsys.readouterr().err
    assert run("adapters", ["promote", "bot@3", "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stable_version"] == "3"
    assert run("adapters", ["audit", "bot", "--limit", "1"]) == 0
    assert "forced: released without verification" in capsys.readouterr().out


def test_a_tampered_artifact_or_an_old_signature_is_refused_at_promote(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvstack.lora.registry import AdapterRegistry

    keys = tmp_path / "keys"
    assert run("adapters", ["keygen", "--out", str(keys)]) == 0
    for version in ("1", "2", "3"):
        src = synthetic_adapter(tmp_path / "sources" / version, seed=int(version))
        assert run("adapters", _register_args(src, version)) == 0
        assert (
            run("adapters", ["sign", f"bot@{version}", "--key", str(keys / "signing-key.pem")]) == 0
        )
    registry = AdapterRegistry(env["KVSTACK_LORA_REGISTRY_URL"])
    stored = registry.get("bot", "2").artifact_uri.removeprefix("file://")
    weights = Path(stored) / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\x00\x00\x00\x01")
    capsys.readouterr()
    assert run("adapters", ["promote", "bot@2"]) == 1
    assert "digest_mismatch" in capsys.readouterr().err
    # A signature of the first format (bare base64) is refused with how to re-sign.
    v3 = registry.get("bot", "3")
    registry.set_signature("bot", "3", v3.signature.partition(":")[2], v3.signer)
    assert run("adapters", ["promote", "bot@3"]) == 1
    err = capsys.readouterr().err
    assert "old_signature_format" in err and "re-sign it: kvstack adapters sign bot@3" in err


def test_keygen_creates_the_private_key_0600_and_never_overwrites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_chmod(*_: object, **__: object) -> None:
        raise AssertionError("the key was chmod'ed after it was written")

    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(Path, "chmod", no_chmod)
    old = os.umask(0)  # a permissive umask must not widen the key's mode
    try:
        assert run("adapters", ["keygen", "--out", str(tmp_path)]) == 0
    finally:
        os.umask(old)
    assert (tmp_path / "signing-key.pem").stat().st_mode & 0o777 == 0o600
    before = (tmp_path / "signing-key.pem").read_bytes()
    assert run("adapters", ["keygen", "--out", str(tmp_path)]) == 1
    assert "never overwrites" in capsys.readouterr().err
    assert (tmp_path / "signing-key.pem").read_bytes() == before


def test_promoting_a_version_the_base_model_no_longer_fits_is_refused(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Signed and intact, but the base model changed since it was registered (another hidden
    size): promote and canary verify compatibility too, before anything is released."""
    keys = tmp_path / "keys"
    assert run("adapters", ["keygen", "--out", str(keys)]) == 0
    src = synthetic_adapter(tmp_path / "sources" / "1", seed=1)
    assert run("adapters", _register_args(src, "1")) == 0
    assert run("adapters", ["sign", "bot@1", "--key", str(keys / "signing-key.pem")]) == 0
    config = tmp_path / "base" / "config.json"
    fields = json.loads(config.read_text())
    config.write_text(json.dumps({**fields, "hidden_size": fields["hidden_size"] * 2}))
    capsys.readouterr()
    assert run("adapters", ["promote", "bot@1"]) == 1
    err = capsys.readouterr().err
    assert "shape_mismatch" in err and "base model toy" in err, err
    assert run("adapters", ["canary", "bot@1", "--percent", "10"]) == 1
    config.write_text(json.dumps(fields))  # the base model it was made for: released
    capsys.readouterr()
    assert run("adapters", ["promote", "bot@1"]) == 0


def test_build_toy_writes_peft_adapters_that_fit_the_toy_model_it_copies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README tour's adapters: real PEFT files of the toy model, distinct per seed, whose
    shapes the verifier accepts against the base model directory written beside them."""
    from kvstack.lora.basemodel import BaseModelDims
    from kvstack.lora.manifest import Manifest
    from kvstack.lora.peft_format import inspect_adapter

    base, outs = tmp_path / "toy", [tmp_path / "a" / "v1", tmp_path / "a" / "v2"]
    argv = ["build-toy", *map(str, outs), "--base-model-dir", str(base), "--rank", "4"]
    assert run("adapters", argv) == 0, capsys.readouterr().err
    dims = BaseModelDims.from_config_dir("toy", base)
    for out in outs:
        info = inspect_adapter(out, dims, ("q_proj", "v_proj"), 1 << 30)
        assert (info.rank, info.target_modules) == (4, ("q_proj", "v_proj"))
    digests = {Manifest.of_dir(out).digest for out in outs}
    assert len(digests) == 2  # seeds 1 and 2: different weights, so different versions
    assert "seed 2" in capsys.readouterr().out
