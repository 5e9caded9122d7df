"""An LMCache configuration, translated into kvstack's ``kv`` section and connector settings.

Engines that ran LMCache's connector switch to kvstack's by changing the connector's name in
``--kv-transfer-config`` and keeping their LMCache configuration. It is read from where LMCache
reads it:

1. ``LMCACHE_CONFIG_FILE``: a YAML (or JSON) file of LMCache keys; when it is set, the other
   ``LMCACHE_*`` variables are ignored, as LMCache ignores them;
2. otherwise the ``LMCACHE_<KEY>`` environment variables;
3. over both, LMCache keys in ``kv_connector_extra_config`` (``lmcache.<key>``, or the bare
   key where kvstack has no key of that name).

Each key is translated (``chunk_size`` → ``chunk_size``; ``local_cpu`` and
``max_local_cpu_size`` → a ``cpu://`` tier; ``local_disk`` and ``max_local_disk_size`` → a
``file://`` tier; ``remote_url`` → a ``redis://`` or ``s3://`` tier; ...), accepted when its
value asks for what kvstack does anyway (``remote_serde: naive``, ``enable_pd: false``), or
refused: a key with no equivalent is an error naming the key and the reason. The table is
``docs/migrating.md``; sizes in GB are taken as GiB, as LMCache allocates them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from kvstack.errors import ConfigError

__all__ = ["LMCacheTranslation", "lmcache_keys", "translate_lmcache"]

PREFIX = "lmcache."
ENV_PREFIX = "LMCACHE_"
# LMCache's own defaults for the keys that decide its tiers (what an LMCache config that
# leaves them out runs with).
DEFAULT_CPU_GB = 5.0
# LMCACHE_* variables that configure LMCache's process, not its cache: ignored.
PROCESS_ENV = frozenset({"LMCACHE_LOG_LEVEL", "LMCACHE_TRACK_USAGE", "LMCACHE_USE_EXPERIMENTAL"})

Reason = str
_NO_EQUIVALENT: dict[str, Reason] = {
    "blocking_timeout_secs": "kvstack bounds each tier by its URL options (timeout_s, "
    "connect_timeout_s) and the connector's lookup_timeout_s",
    "py_enable_gc": "kvstack does not switch Python's garbage collector",
    "enable_blending": "CacheBlend (reusing KV of non-prefix text) has no equivalent: kvstack "
    "reuses exact prefixes only",
    "blend_recompute_ratio": "CacheBlend has no equivalent in kvstack",
    "blend_min_tokens": "CacheBlend has no equivalent in kvstack",
    "blend_special_str": "CacheBlend has no equivalent in kvstack",
    "enable_p2p": "LMCache's P2P goes through its controller; kvstack's equivalent is a peer:// "
    "tier found through the index server: add 'peer://?index=URL' to tiers and set "
    "index.peer.enabled and index.announce.index_url",
    "lookup_url": "LMCache's controller has no equivalent; kvstack engines announce to the "
    "index server (index.announce.index_url)",
    "distributed_url": "LMCache's P2P transport has no equivalent; kvstack peers serve each "
    "other through the peer server (index.peer)",
    "enable_controller": "LMCache's controller has no equivalent; the kvstack router asks "
    "kvstack's index server (router.prefix.index_url)",
    "controller_url": "LMCache's controller has no equivalent (see enable_controller)",
    "lmcache_instance_id": "kvstack names an engine by its URL (index.announce.instance_id)",
    "enable_pd": "kvstack's prefill/decode moves KV through shared tiers (kv_role kv_producer "
    "or kv_consumer and the router's pd section), not over NIXL",
    "pd_role": "kvstack's prefill/decode roles are vLLM's kv_role (kv_producer, kv_consumer)",
    "transfer_channel": "kvstack moves KV through its tiers, not over a NIXL channel",
    "nixl_buffer_size": "kvstack moves KV through its tiers, not over NIXL",
    "nixl_buffer_device": "kvstack moves KV through its tiers, not over NIXL",
    "gds_path": "GPU Direct Storage has no kvstack tier",
    "cufile_buffer_size": "GPU Direct Storage has no kvstack tier",
    "internal_api_server_enabled": "kvstack's connector runs no API server of its own; its "
    "stats are on vLLM's /metrics",
    "extra_config": "backend-specific LMCache options have no kvstack equivalent: put tier "
    "options in the tier URLs",
}
# Keys accepted only with the value that asks for what kvstack does anyway.
_DECODE = "kvstack saves the KV of full prompt chunks only, never of generated tokens"
_UNFULL = (
    "kvstack's connector stores full chunks only; a prompt's trailing partial chunk is "
    "recomputed (it is at most chunk_size - 1 tokens)"
)
_LAYERWISE = "kvstack's connector moves whole chunks; there is no layer-wise mode to switch on"
_LOSSY = (
    "lossy KV compression (CacheGen, KIVI) has no equivalent: kvstack stores exact KV "
    "(lossless zstd or lz4 per tier: ?compression=zstd)"
)
_ONLY_VALUE: dict[str, tuple[Any, Reason]] = {
    "enable_blending": (False, _NO_EQUIVALENT["enable_blending"]),
    "enable_p2p": (False, _NO_EQUIVALENT["enable_p2p"]),
    "enable_pd": (False, _NO_EQUIVALENT["enable_pd"]),
    "enable_controller": (False, _NO_EQUIVALENT["enable_controller"]),
    "internal_api_server_enabled": (False, _NO_EQUIVALENT["internal_api_server_enabled"]),
    "save_decode_cache": (False, _DECODE),
    "use_layerwise": (False, _LAYERWISE),
    "save_unfull_chunk": (False, _UNFULL),
    "remote_serde": ("naive", _LOSSY),
}
_KEYS = {"chunk_size", "local_cpu", "max_local_cpu_size", "local_disk", "max_local_disk_size",
         "remote_url", "cache_policy", "pre_caching_hash_algorithm",
         *_NO_EQUIVALENT, *_ONLY_VALUE}  # fmt: skip
_BOOLS = {"local_cpu", "save_unfull_chunk", "save_decode_cache", "use_layerwise", "py_enable_gc",
          "enable_blending", "enable_p2p", "enable_pd", "enable_controller",
          "internal_api_server_enabled"}  # fmt: skip
_NUMBERS = {"chunk_size", "max_local_cpu_size", "max_local_disk_size", "blocking_timeout_secs"}
_POLICIES = {"lru": "lru", "fifo": "fifo", "s3fifo": "s3fifo", "s3-fifo": "s3fifo"}


@dataclass(frozen=True, slots=True)
class LMCacheTranslation:
    """What an LMCache configuration became: ``kv`` keys, and one line per key for the log."""

    kv: dict[str, Any]
    lines: tuple[str, ...]
    sources: tuple[str, ...]  # where the keys came from (file, environment, extra config)


@dataclass(slots=True)
class _Found:
    keys: dict[str, Any] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)


def lmcache_keys(
    extra: Mapping[str, Any], environ: Mapping[str, str], kvstack_keys: set[str]
) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """(LMCache keys, their sources, the extra config left for kvstack)."""
    found = _Found()
    config_file = environ.get(ENV_PREFIX + "CONFIG_FILE")
    if config_file:
        found.keys.update(_read_file(config_file))
        found.sources.append(f"LMCACHE_CONFIG_FILE={config_file}")
    else:
        from_env = _from_environment(environ)
        if from_env:
            found.keys.update(from_env)
            found.sources.append("LMCACHE_* environment")
    rest: dict[str, Any] = {}
    from_extra = {}
    for key, value in extra.items():
        if key.startswith(PREFIX):
            from_extra[key[len(PREFIX) :]] = value
        elif key in _KEYS and key not in kvstack_keys:
            from_extra[key] = value
        else:
            rest[key] = value
    if from_extra:
        found.keys.update(from_extra)
        found.sources.append("kv_connector_extra_config")
    return found.keys, found.sources, rest


def _read_file(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"LMCACHE_CONFIG_FILE {path!r} cannot be read: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"LMCACHE_CONFIG_FILE {path!r} must hold a mapping of LMCache keys")
    return data


def _from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, text in environ.items():
        if not name.startswith(ENV_PREFIX) or name in PROCESS_ENV:
            continue
        out[name[len(ENV_PREFIX) :].lower()] = _env_value(name, text)
    return out


def _env_value(name: str, text: str) -> Any:
    key = name[len(ENV_PREFIX) :].lower()
    if text.strip().lower() in ("", "none", "null"):
        return None
    if key in _BOOLS:
        return text.strip().lower() in ("1", "true", "yes", "on")
    if key in _NUMBERS:
        try:
            return int(text) if key == "chunk_size" else float(text)
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not a number") from None
    return text


def translate_lmcache(keys: Mapping[str, Any], sources: list[str]) -> LMCacheTranslation:
    """The ``kv`` keys an LMCache configuration amounts to; ConfigError names a key kvstack
    cannot honour and why."""
    for key, value in keys.items():
        _check_key(key, value)
    kv: dict[str, Any] = {}
    lines: list[str] = []
    for translate in _TRANSLATORS:
        translate(keys, kv, lines)
    if not kv.get("tiers"):
        raise ConfigError(
            "the LMCache configuration leaves no tier: local_cpu is false and neither "
            "local_disk nor remote_url is set"
        )
    return LMCacheTranslation(kv, tuple(lines), tuple(sources))


def _check_key(key: str, value: Any) -> None:
    if key not in _KEYS:
        raise ConfigError(f"LMCache key {key!r} is not one kvstack knows how to translate")
    if key in _ONLY_VALUE:
        wanted, reason = _ONLY_VALUE[key]
        if value is not None and value != wanted:
            raise ConfigError(f"LMCache key {key}={value!r} has no kvstack equivalent: {reason}")
        return
    if key in _NO_EQUIVALENT and value is not None:
        raise ConfigError(f"LMCache key {key!r} has no kvstack equivalent: {_NO_EQUIVALENT[key]}")


def _gib(value: Any, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"LMCache key {key} must be a positive size in GB, got {value!r}")
    return f"{value:g}GiB"


def _chunk(keys: Mapping[str, Any], kv: dict[str, Any], lines: list[str]) -> None:
    if keys.get("chunk_size") is not None:
        kv["chunk_size"] = keys["chunk_size"]
        lines.append(f"chunk_size={keys['chunk_size']} -> chunk_size")
    if keys.get("pre_caching_hash_algorithm") is not None:
        lines.append("pre_caching_hash_algorithm: kvstack's keys are always BLAKE2b-128 of the "
                     "tokens, the same in every process (the value is not needed)")  # fmt: skip


def _policy(keys: Mapping[str, Any]) -> str:
    policy = keys.get("cache_policy")
    if policy is None:
        return ""
    name = _POLICIES.get(str(policy).lower())
    if name is None:
        raise ConfigError(
            f"LMCache key cache_policy={policy!r} has no kvstack equivalent: kvstack's tiers "
            f"evict by {', '.join(sorted(set(_POLICIES.values())))}"
        )
    return f"&policy={name}"


def _local_tiers(keys: Mapping[str, Any], kv: dict[str, Any], lines: list[str]) -> None:
    tiers: list[str] = kv.setdefault("tiers", [])
    policy = _policy(keys)
    if keys.get("local_cpu", True) is not False:
        size = keys.get("max_local_cpu_size")
        size = DEFAULT_CPU_GB if size is None else size
        tiers.append(f"cpu://?size={_gib(size, 'max_local_cpu_size')}{policy}")
        lines.append(f"local_cpu, max_local_cpu_size={size:g} -> {tiers[-1]}")
    disk = keys.get("local_disk")
    if disk:
        size = keys.get("max_local_disk_size")
        if not size:
            raise ConfigError(
                "LMCache key local_disk is set but max_local_disk_size is 0 or missing: give "
                "the disk tier a size in GB"
            )
        path = urlsplit(disk).path if str(disk).startswith("file://") else str(disk)
        tiers.append(f"file://{path.rstrip('/')}?size={_gib(size, 'max_local_disk_size')}{policy}")
        lines.append(f"local_disk={disk}, max_local_disk_size={size:g} -> {tiers[-1]}")


def _remote_tier(keys: Mapping[str, Any], kv: dict[str, Any], lines: list[str]) -> None:
    url = keys.get("remote_url")
    if not url:
        return
    scheme, _, rest = str(url).partition("://")
    schemes = {"redis": "redis", "rediss": "rediss", "valkey": "redis", "s3": "s3"}
    if scheme not in schemes:
        raise ConfigError(
            f"LMCache key remote_url={url!r} has no kvstack equivalent: kvstack's shared tiers "
            "are redis:// or rediss:// (Redis, Valkey, Redis Cluster), s3:// and peer:// "
            "(LMCache's lm:// server, Mooncake, InfiniStore and fs:// have none)"
        )
    kv["tiers"].append(f"{schemes[scheme]}://{rest}")
    lines.append(f"remote_url={url} -> {kv['tiers'][-1]}")


_TRANSLATORS: tuple[Callable[[Mapping[str, Any], dict[str, Any], list[str]], None], ...] = (
    _chunk,
    _local_tiers,
    _remote_tier,
)


def environment() -> Mapping[str, str]:
    """The process environment (a seam for tests)."""
    return os.environ
