"""Configuration of the router's scheduling: the ``pipeline`` and ``prefix`` subsections.

::

    router:
      prefix:
        tokenizers: {llama-8b: /models/llama-8b, sim-model: sim}
        events:
          sources: {"http://10.0.0.1:8000": "tcp://10.0.0.1:5557"}
        index_url: http://kv-index:8300
        tier_weights: {gpu: 1.0, cpu: 0.75, disk: 0.5, redis: 0.5, s3: 0.25}
      pipeline:
        scorers: [{name: prefix, weight: 3}, {name: least_load, weight: 2}]

``policy`` (one of :data:`POLICIES`) names a preset pipeline; ``pipeline`` spells one out
(filters, weighted scorers, a picker, each by registered name with ``args``). Weights and the
cost model's knobs are plugin ``args``; the priority admission's settings are the ``admission``
plugin's ``args`` (:mod:`kvstack.router.admission.config`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from kvstack.index.config import RadixConfig
from kvstack.index.urls import check_index_url, redact_url
from kvstack.section import Section

__all__ = [
    "DEFAULT_TIER_WEIGHTS",
    "POLICIES",
    "EventsConfig",
    "PipelineConfig",
    "PluginSpec",
    "PrefixConfig",
]

POLICIES = ("ttft", "prefix", "round_robin", "least_load", "session", "random")

# Credit of a cached token by where it is: loading from host memory or disk costs time that a
# device hit does not (Dynamo's per-tier credits are of the same shape).
DEFAULT_TIER_WEIGHTS = {
    "gpu": 1.0,
    "routed": 1.0,
    "cpu": 0.75,
    "disk": 0.5,
    "file": 0.5,
    "redis": 0.5,
    "peer": 0.5,
    "s3": 0.25,
}


class EventsConfig(Section):
    sources: dict[str, str] = Field(
        default_factory=dict,
        description="backend (name or URL) -> ZMQ endpoint of its KV events, e.g. "
        "tcp://10.0.0.1:5557 (the engine binds tcp://*:5557); prefix with bind+ when the "
        "engine connects to the router instead (vLLM connects for a non-wildcard endpoint)",
    )
    port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="for backends without a source: connect to tcp://<backend host>:<port>",
    )
    topic: str = Field(default="", description="topic prefix subscribed to")
    replay_port_offset: int | None = Field(
        default=None,
        description="replay (ROUTER) socket at the event port plus this offset; None: no "
        "replay, a gap switches the backend to approximate mode at once",
    )
    recover_after_s: float = Field(
        default=30.0,
        gt=0,
        description="after an unrecoverable gap, rebuild from new events for this long "
        "before trusting them again (approximate mode meanwhile)",
    )


class PrefixConfig(Section):
    tokenizers: dict[str, str] = Field(
        default_factory=dict,
        description="base model -> tokenizer: a local model directory (transformers, chat "
        "template included), 'sim' or 'sim:VOCAB' (the simulator's), or 'chars' (4-character "
        "blocks, approximate only); models not listed use default_tokenizer",
    )
    default_tokenizer: str = Field(default="chars", description="tokenizer of other models")
    index: RadixConfig = Field(default_factory=RadixConfig, description="the radix tree")
    events: EventsConfig = Field(
        default_factory=EventsConfig, description="KV event subscriptions (precise mode)"
    )
    index_url: str | None = Field(
        default=None,
        description="the cluster KV index (shared and local kvstack tiers): the index server "
        "at http://host:port or zmq://host:port (its zmq_port, lower latency), or Valkey at "
        "redis://host:port or rediss://host:port (?cluster=true, ?sentinel=NAME); None: not used",
    )
    index_timeout_s: float = Field(
        default=0.05, gt=0, description="a slower index lookup is skipped (no tier credit)"
    )
    share_url: str | None = Field(
        default=None,
        description="Valkey (redis:// or rediss://) where router replicas share what each "
        "routed: in-flight requests per engine and their prompts; None: each replica knows "
        "only its own",
    )
    share_channel: str = Field(
        default="kvstack:router", min_length=1, description="pub/sub channel of one fleet"
    )
    share_timeout_s: float = Field(
        default=300.0, gt=0, description="drop another replica's request unfinished this long"
    )
    shared_for_all: bool = Field(
        default=True,
        description="a prefix in a shared store (redis, s3, shared disk) counts for every "
        "backend (they all run kvstack's connector); false: only for engines the index knows",
    )
    tier_weights: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_TIER_WEIGHTS),
        description="credit of a cached token per tier (gpu, routed, cpu, disk, redis, s3, "
        "peer, ...); a tier not listed gets 0.5",
    )

    @field_validator("index_url")
    @classmethod
    def _index_url(cls, value: str | None) -> str | None:
        return check_index_url(value) if value else value

    @field_validator("share_url")
    @classmethod
    def _share_url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("redis://", "rediss://")):
            raise ValueError(f"share_url must be redis:// or rediss://, got {redact_url(value)!r}")
        return value

    @field_validator("tier_weights")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if not 0 <= v <= 1}
        if bad:
            raise ValueError(f"tier weights must be in [0, 1], got {bad}")
        return {**DEFAULT_TIER_WEIGHTS, **value}


class PluginSpec(Section):
    name: str = Field(min_length=1, description="registered plugin name")
    weight: float = Field(default=1.0, ge=0, description="scorer weight (ignored elsewhere)")
    args: dict[str, Any] = Field(default_factory=dict, description="plugin arguments")


class PipelineConfig(Section):
    filters: list[PluginSpec] = Field(default_factory=list, description="filters, in order")
    scorers: list[PluginSpec] = Field(default_factory=list, description="weighted scorers")
    picker: PluginSpec = Field(
        default_factory=lambda: PluginSpec(name="max_score"), description="the picker"
    )
