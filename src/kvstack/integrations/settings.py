"""Settings of the vLLM connector: the ``kv_connector_extra_config`` of ``--kv-transfer-config``.

Connector keys (below) are read here; every other key is a ``kv`` section key (``tiers``,
``chunk_size``, ``write_policy``, ``admission_threshold``...) and goes to the KV cache, over the
YAML file named by ``KVSTACK_CONFIG`` and under ``KVSTACK_KV_*`` environment variables. Unknown
keys are errors, reported at engine start. ``security`` holds the engine's ``security`` section
(``{"cluster_secret_file": PATH}``), over the YAML file and under ``KVSTACK_SECURITY_*``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from kvstack.cluster.config import IndexConfig
from kvstack.errors import ConfigError
from kvstack.kv.config import KVConfig
from kvstack.section import Section, load_section
from kvstack.security import SecurityConfig

__all__ = ["ConnectorSettings", "index_section", "security_section", "split_extra_config"]


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


def index_section(settings: ConnectorSettings) -> IndexConfig:
    """The engine's ``index`` section: its extra config over YAML and ``KVSTACK_INDEX_*``."""
    return load_section("index", IndexConfig, settings.index)


def security_section(settings: ConnectorSettings) -> SecurityConfig:
    """The engine's ``security`` section: its extra config over YAML and ``KVSTACK_SECURITY_*``."""
    return load_section("security", SecurityConfig, settings.security)


def split_extra_config(extra: Mapping[str, Any] | None) -> tuple[ConnectorSettings, KVConfig]:
    """Split the extra config into connector settings and the ``kv`` section."""
    extra = dict(extra or {})
    connector = {k: extra.pop(k) for k in list(extra) if k in _CONNECTOR_KEYS}
    try:
        settings = ConnectorSettings.model_validate(connector)
    except ValueError as exc:
        raise ConfigError(f"invalid kvstack connector setting: {exc}") from None
    return settings, load_section("kv", KVConfig, extra)
