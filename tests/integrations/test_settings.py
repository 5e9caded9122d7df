"""The connector's extra config: connector keys apart, the rest is the kv section."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstack.errors import ConfigError
from kvstack.integrations.settings import TransferModes, split_extra_config, transfer_modes


def test_split_connector_keys_from_kv_keys() -> None:
    settings, kv = split_extra_config(
        {"tiers": ["cpu://?size=1MiB"], "chunk_size": 512, "save_mode": "sync", "kv_events": False}
    )
    assert settings.save_mode == "sync" and settings.kv_events is False
    assert kv.chunk_size == 512 and kv.tiers == ["cpu://?size=1MiB"]


def test_unknown_key_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVSTACK_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="chunk_sise"):
        split_extra_config({"chunk_sise": 256})


def test_bad_connector_value_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="on_load_failure"):
        split_extra_config({"on_load_failure": "explode"})


def test_environment_overrides_kv_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSTACK_KV_CHUNK_SIZE", "1024")
    _, kv = split_extra_config({"chunk_size": 256})
    assert kv.chunk_size == 1024


def test_the_cluster_secret_comes_from_the_extra_config_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvstack.integrations.settings import security_section
    from kvstack.kv import KVCache
    from kvstack.security import load_keys, write_secret_file

    secret = write_secret_file(tmp_path / "cluster-secret")
    settings, kv = split_extra_config(
        {
            "tiers": [f"file://{tmp_path}/kv?size=1MiB"],
            "security": {"cluster_secret_file": str(secret)},
        }
    )
    keys = load_keys(security_section(settings))
    assert keys is not None
    with KVCache(kv, keys=keys) as cache:  # what the worker side builds
        assert cache.trust.sealed and cache.tiers[0].trust is cache.trust
    monkeypatch.setenv("KVSTACK_SECURITY_CLUSTER_SECRET_FILE", str(secret))
    settings, _ = split_extra_config({"tiers": ["cpu://?size=1MiB"]})
    from_env = load_keys(security_section(settings))
    assert from_env is not None and from_env.fingerprint == keys.fingerprint


def test_copy_modes_default_by_device_and_follow_the_settings() -> None:
    defaults, _ = split_extra_config({})
    assert transfer_modes(defaults, "cpu") == TransferModes(False, True)
    assert transfer_modes(defaults, "cuda") == TransferModes(True, True)
    chosen, _ = split_extra_config({"copy_out": "background", "layer_pipelining": False})
    assert transfer_modes(chosen, "cpu") == TransferModes(True, False)
    assert transfer_modes(chosen, "cuda") == TransferModes(True, False)
    assert defaults.load_mode == "auto" and defaults.save_generated is True


def test_a_load_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="load_timeout_s"):
        split_extra_config({"load_timeout_s": 0})
