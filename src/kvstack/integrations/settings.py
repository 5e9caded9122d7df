"""Settings of the vLLM connector: the ``kv_connector_extra_config`` of ``--kv-transfer-config``.

Connector keys (below) are read here; every other key is a ``kv`` section key (``tiers``,
``chunk_size``, ``write_policy``, ``admission_threshold``...) and goes to the KV cache, over the
YAML file named by ``KVSTACK_CONFIG`` and under ``KVSTACK_KV_*`` environment variables. Unknown
keys are errors, reported at engine start. ``security`` holds the engine's ``security`` section
(``{"cluster_secret_file": PATH}``), over the YAML file and under ``KVSTACK_SECURITY_*``.

An LMCache configuration is accepted too (``LMCACHE_CONFIG_FILE``, ``LMCACHE_*`` variables,
``lmcache.*`` keys): :mod:`kvstack.integrations.lmcache` translates it into ``kv`` keys, logged
once per process, and refuses a key kvstack has no equivalent for, naming it and why.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from pydantic import Field

from kvstack.cluster.config import IndexConfig
from kvstack.errors import ConfigError
from kvstack.integrations.lmcache import environment, lmcache_keys, translate_lmcache
from kvstack.kv.config import KVConfig
from kvstack.section import Section, load_section
from kvstack.security import SecurityConfig

__all__ = [
    "ConnectorSettings",
    "LoadMode",
    "TransferModes",
    "index_section",
    "security_section",
    "split_extra_config",
    "transfer_modes",
]

log = logging.getLogger(__name__)
_logged: set[tuple[str, ...]] = set()  # translations already logged by this process


LoadMode = Literal["auto", "async", "sync"]  # where a slow-tier load runs: see load_mode


class ConnectorSettings(Section):
    model_fingerprint: str | None = Field(
        default=None,
        description="identity of the weights in the key namespace; default: the model name, "
        "revision and a digest of its config.json. Set it when two hosts load the same "
        "weights from different paths, or different weights from the same path.",
    )
    save_mode: Literal["async", "sync"] | None = Field(
        default=None,
        description="async: slow tiers write in the background; sync: the step waits until "
        "every tier has the chunk (default: sync for kv_producer, async otherwise)",
    )
    lookup_timeout_s: float = Field(
        default=2.0, gt=0, description="scheduler-to-worker lookup timeout; a timeout is a miss"
    )
    on_load_failure: Literal["recompute", "fail"] = Field(
        default="recompute",
        description="what vLLM does when a chunk vanishes or is corrupt at load time",
    )
    kv_events: bool = Field(
        default=True, description="report kvstack tier stores/removals in vLLM's KV events"
    )
    load_mode: LoadMode = Field(
        default="auto",
        description="auto: a load served from the cpu:// tier runs within its step; one from "
        "a slower tier runs within the step when this engine's measured cost of it (seconds "
        "per chunk x chunks x requests stepping) is at most a typical step's, else "
        "asynchronously (the request waits while the others keep stepping); async / sync: "
        "always",
    )
    request_load_mode: bool = Field(
        default=False,
        description='honour a request\'s own load mode, `kv_transfer_params: {"kvstack": '
        '{"load_mode": "sync" | "async" | "auto"}}`, over load_mode (benchmarks pairing the '
        "modes on one engine, trusted clients); off: such a field is ignored, since a client "
        "that may set it can make its loads stall every request stepping beside them",
    )
    load_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="an asynchronous load still running after this long is abandoned; vLLM "
        "recomputes the blocks that had not arrived",
    )
    shutdown_flush_s: float = Field(
        default=25.0,
        gt=0,
        description="at engine shutdown, how long queued copy-outs and tier writes may take "
        "to land before the rest is dropped (capped by vLLM's "
        "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS; vLLM's default --shutdown-timeout 0 kills the "
        "worker before any of it runs)",
    )
    load_finish_wait: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="opt-in: at the end of a step, wait for an asynchronous load this worker "
        "predicts will end within the wait, so that vLLM schedules its request a step sooner: "
        "at most this fraction of a typical step (0.25 keeps a step within 1.25x), and at most "
        "a step divided by the requests stepping; each load once. Off by default: it stalls "
        "the batch, if boundedly, and on vLLM's CPU build no wait caught its load",
    )
    load_threads: int = Field(
        default=2, ge=1, le=32, description="threads fetching asynchronous loads per worker"
    )
    load_fetch: Literal["thread", "process"] = Field(
        default="thread",
        description="opt-in, vLLM's CPU build: `process` reads the asynchronous loads fetched "
        "for the next step in a helper process per worker, into memory it shares with the "
        "worker, so that the reads do not take the interpreter lock from the engine's step "
        "(`kvstack bench fetch`); it reads the disk, Redis and S3 tiers, the worker its own "
        "cpu:// tier. `thread`: the worker's load threads read them",
    )
    staging_mib: int = Field(
        default=2048,
        ge=1,
        description="host memory (pinned on GPUs) each worker may hold to stage chunks between "
        "its paged KV and the tiers: the copy-outs waiting for a tier write (the step waits "
        "for the save thread beyond it; none are staged where the first tier is cpu://, which "
        "lends its own memory), the synchronous loads' buffers kept between steps, and on "
        "vLLM's CPU build the asynchronous loads fetched and waiting for the next step to "
        "write them (a load that does not fit writes as it fetches) get this much each, every "
        "asynchronous load thread an eighth of it; at least one chunk each",
    )
    save_generated: bool = Field(
        default=True,
        description="save every full chunk a request completes, generated tokens included (the "
        "next turn of a chat, a preempted request); false: prompt chunks only",
    )
    copy_out: Literal["step", "background"] | None = Field(
        default=None,
        description="step: the step waits for its copy-out of new chunks; background: the "
        "copy-out overlaps the next step and a finished request's blocks are freed when it "
        "is over; default: background on GPUs, step on vLLM's CPU build (measured faster)",
    )
    layer_pipelining: bool = Field(
        default=True,
        description="write loaded KV layer by layer while earlier layers compute, and copy "
        "saved KV out as each layer finishes; on by default for GPUs and for vLLM's CPU build "
        "(measured on the CPU build: hit TTFT 2% lower, 95% interval 1.1-2.9%)",
    )
    index: dict[str, Any] = Field(
        default_factory=dict,
        description="the `index` section for this engine: announce its chunks to a cluster "
        "index service (announce.index_url, announce.instance_id = the engine's URL) and lend "
        "its tiers to peers (peer.enabled)",
    )
    security: dict[str, Any] = Field(
        default_factory=dict,
        description="the `security` section for this engine: cluster_secret_file (chunk MACs, "
        "peer and index authentication), previous_secret_file, insecure_no_auth",
    )


_CONNECTOR_KEYS = set(ConnectorSettings.model_fields)
_KV_KEYS = set(KVConfig.model_fields)


class TransferModes(NamedTuple):
    """How copies run, as both connector roles resolve them for one device type."""

    copy_out_background: bool
    layer_pipelining: bool


def transfer_modes(settings: ConnectorSettings, device_type: str) -> TransferModes:
    """The settings' copy modes, with the defaults for ``device_type`` filled in."""
    gpu = device_type == "cuda"
    copy_out = settings.copy_out or ("background" if gpu else "step")
    return TransferModes(copy_out == "background", settings.layer_pipelining)


def index_section(settings: ConnectorSettings) -> IndexConfig:
    """The engine's ``index`` section: its extra config over YAML and ``KVSTACK_INDEX_*``."""
    return load_section("index", IndexConfig, settings.index)


def security_section(settings: ConnectorSettings) -> SecurityConfig:
    """The engine's ``security`` section: its extra config over YAML and ``KVSTACK_SECURITY_*``."""
    return load_section("security", SecurityConfig, settings.security)


def split_extra_config(extra: Mapping[str, Any] | None) -> tuple[ConnectorSettings, KVConfig]:
    """Split the extra config into connector settings and the ``kv`` section (an LMCache
    configuration translated into it)."""
    extra = _with_lmcache(dict(extra or {}))
    connector = {k: extra.pop(k) for k in list(extra) if k in _CONNECTOR_KEYS}
    try:
        settings = ConnectorSettings.model_validate(connector)
    except ValueError as exc:
        raise ConfigError(f"invalid kvstack connector setting: {exc}") from None
    return settings, load_section("kv", KVConfig, extra)


def _with_lmcache(extra: dict[str, Any]) -> dict[str, Any]:
    """``extra`` with any LMCache configuration translated into ``kv`` keys."""
    keys, sources, rest = lmcache_keys(extra, environment(), _CONNECTOR_KEYS | _KV_KEYS)
    if not keys:
        return extra
    translation = translate_lmcache(keys, sources)
    clashes = sorted(k for k in translation.kv if k in rest and rest[k] != translation.kv[k])
    if clashes:
        raise ConfigError(
            f"both kvstack keys and an LMCache configuration set {clashes}: keep one of them"
        )
    lines = (*translation.sources, *translation.lines)
    if lines not in _logged:
        _logged.add(lines)
        log.info(
            "LMCache configuration (from %s) translated into kvstack's kv section: %s",
            ", ".join(translation.sources),
            "; ".join(translation.lines),
        )
    return {**rest, **translation.kv}
