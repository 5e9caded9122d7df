"""LMCache configurations (hand-written in LMCache's format, ``examples/lmcache``) become the
kvstack ``kv`` section they mean, from a file, the environment or the extra config; a key with
no kvstack equivalent is an error naming it and why."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from kvstack.errors import ConfigError
from kvstack.integrations.settings import split_extra_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "lmcache"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(("LMCACHE_", "KVSTACK_")):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("example", "chunk_size", "tiers", "partial"),
    [
        ("cpu-offload.yaml", 256, ["cpu://?size=4GiB"], False),
        (
            "cpu-and-disk.yaml",
            256,
            ["cpu://?size=8GiB&policy=lru", "file:///var/cache/kvstack?size=200GiB&policy=lru"],
            False,
        ),
        ("shared-valkey.yaml", 256, ["cpu://?size=2GiB", "redis://kv-valkey:6379"], False),
    ],
)
def test_lmcache_config_files_translate(
    monkeypatch: pytest.MonkeyPatch, example: str, chunk_size: int, tiers: list[str], partial: bool
) -> None:
    monkeypatch.setenv("LMCACHE_CONFIG_FILE", str(EXAMPLES / example))
    monkeypatch.setenv("LMCACHE_CHUNK_SIZE", "999")  # ignored beside a file, as LMCache does
    _, kv = split_extra_config({})
    assert (kv.chunk_size, kv.tiers, kv.save_partial_chunks) == (chunk_size, tiers, partial)


def test_the_environment_and_the_extra_config_say_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    native = {"chunk_size": 512, "tiers": ["cpu://?size=3GiB", "file:///tmp/kv?size=10GiB"]}
    _, expected = split_extra_config(native)
    env = {
        "LMCACHE_CHUNK_SIZE": "512",
        "LMCACHE_LOCAL_CPU": "True",
        "LMCACHE_MAX_LOCAL_CPU_SIZE": "3",
        "LMCACHE_LOCAL_DISK": "file:///tmp/kv/",
        "LMCACHE_MAX_LOCAL_DISK_SIZE": "10",
        "LMCACHE_LOG_LEVEL": "INFO",  # configures LMCache's process, not its cache: ignored
    }
    with monkeypatch.context() as m:
        for name, value in env.items():
            m.setenv(name, value)
        assert split_extra_config({})[1] == expected
    extra = {
        "lmcache.chunk_size": 512,
        "lmcache.max_local_cpu_size": 3,
        "local_disk": "/tmp/kv",
        "max_local_disk_size": 10.0,
    }
    assert split_extra_config(extra)[1] == expected
    # kvstack's own keys go on beside an LMCache configuration.
    settings, kv = split_extra_config({**extra, "admission_threshold": 2, "kv_events": False})
    assert kv.tiers == expected.tiers and kv.admission_threshold == 2 and not settings.kv_events


def test_lmcache_defaults_decide_the_tiers_it_leaves_out() -> None:
    _, kv = split_extra_config({"lmcache.chunk_size": 128})
    assert kv.tiers == ["cpu://?size=5GiB"]  # LMCache's default local CPU cache
    _, kv = split_extra_config({"lmcache.local_cpu": False, "remote_url": "redis://r:6379/0"})
    assert kv.tiers == ["redis://r:6379/0"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"lmcache.enable_p2p": True}, "enable_p2p.*peer://"),
        ({"remote_url": "lm://controller:65432"}, "remote_url.*lm:// server"),
        ({"remote_url": "mooncakestore://m:50051"}, "remote_url.*no kvstack equivalent"),
        ({"lmcache.remote_serde": "cachegen"}, "remote_serde.*lossy"),
        ({"lmcache.save_decode_cache": True}, "save_decode_cache.*prompt chunks only"),
        ({"lmcache.save_unfull_chunk": True}, "save_unfull_chunk.*full chunks only"),
        ({"lmcache.enable_pd": True, "lmcache.pd_role": "sender"}, "enable_pd.*kv_producer"),
        ({"lmcache.enable_blending": True}, "enable_blending.*CacheBlend"),
        ({"lmcache.cache_policy": "LFU"}, "cache_policy='LFU'"),
        ({"lmcache.numa_mode": "auto"}, "'numa_mode' is not one kvstack knows"),
        ({"local_disk": "/x"}, "max_local_disk_size is 0 or missing"),
        ({"lmcache.local_cpu": False}, "leaves no tier"),
        ({"lmcache.max_local_cpu_size": 2, "tiers": ["cpu://?size=1GiB"]}, r"\['tiers'\]"),
    ],
)
def test_keys_without_an_equivalent_are_errors_naming_them(
    extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        split_extra_config(extra)


def test_a_bad_file_or_value_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LMCACHE_CONFIG_FILE", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        split_extra_config({})
    monkeypatch.delenv("LMCACHE_CONFIG_FILE")
    monkeypatch.setenv("LMCACHE_MAX_LOCAL_CPU_SIZE", "lots")
    with pytest.raises(ConfigError, match="LMCACHE_MAX_LOCAL_CPU_SIZE='lots'"):
        split_extra_config({})


def test_the_translation_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    extra = {"lmcache.chunk_size": 256, "lmcache.max_local_cpu_size": 1.5}
    with caplog.at_level(logging.INFO, logger="kvstack.integrations.settings"):
        split_extra_config(extra)
        split_extra_config(extra)  # the scheduler and the worker side of one process
    lines = [r.getMessage() for r in caplog.records if "LMCache configuration" in r.message]
    assert len(lines) == 1 and "cpu://?size=1.5GiB" in lines[0]
