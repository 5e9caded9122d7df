"""The arms of ``kvstack bench lora`` and what each gets, at equal memory.

- ``weighted-lru``: kvstack's hot score, with the never-evict rules (canary, and platinum on its
  home engines) and the demotion rules.
- ``lru-pins``: the engines' LRU order with exactly the same rules, so that what the weighting
  adds can be told apart from what the pins add.
- ``lru``: the engines' own policy: no pins, no rules.

Every arm gets the same GPU and host slots, the same scheduled warmup of platinum adapters at
startup, the same arrivals, engines and store timing. Only the weighted arm reads the hot-score
weights, the rate's window and the tier weights, which is all ``--policy-json`` may change:
a rule given to one arm only would make the comparison unfair again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvstack.lora.config import AdapterCachePolicy, LoRAConfig

__all__ = ["ARMS", "BenchArm", "arm_config", "parse_arms", "parse_overrides", "weighted_defaults"]


@dataclass(frozen=True)
class BenchArm:
    name: str
    eviction_policy: str  # lora.adapter_cache_policy.eviction_policy
    rules: bool  # the never-evict and demotion rules of the weighted arm
    label: str  # in tables


ARMS: dict[str, BenchArm] = {
    a.name: a
    for a in (
        BenchArm("weighted-lru", "weighted-lru", True, "weighted-lru (kvstack)"),
        BenchArm("lru-pins", "lru", True, "LRU + the same pins"),
        BenchArm("lru", "lru", False, "LRU (the engines' own)"),
    )
}
# What --policy-json may set: what only the weighted policy reads.
OVERRIDABLE = ("hot_score", "qps_window_s", "priority_weights")


def parse_arms(text: str) -> list[BenchArm]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ARMS]
    if unknown or not names:
        raise ValueError(f"arms {unknown or names}: choose from {', '.join(ARMS)}")
    return [ARMS[n] for n in names]


def parse_overrides(text: str) -> dict[str, Any]:
    """``--policy-json``: a JSON object with some of :data:`OVERRIDABLE`."""
    import json

    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"--policy-json must be a JSON object, got {text!r}")
    extra = sorted(set(data) - set(OVERRIDABLE))
    if extra:
        raise ValueError(
            f"--policy-json may set {', '.join(OVERRIDABLE)} (read by the weighted arm only); "
            f"got {', '.join(extra)}"
        )
    return data


def arm_config(
    config: LoRAConfig,
    arm: BenchArm,
    gpu_slots: int,
    host_slots: int,
    overrides: dict[str, Any],
) -> LoRAConfig:
    """``config`` for one arm: its policy and slots; no rules for the plain LRU arm."""
    data = config.adapter_cache_policy.model_dump() | {
        "eviction_policy": arm.eviction_policy,
        "gpu_slots_per_base_model": gpu_slots,
        "host_slots_per_base_model": host_slots,
    }
    if not arm.rules:
        data |= {"never_evict_when": [], "demote_when": []}
    update: dict[str, Any] = {}
    if arm.eviction_policy == "weighted-lru":
        hot = overrides.get("hot_score", {})
        data |= {k: v for k, v in overrides.items() if k == "qps_window_s"}
        data["hot_score"] = data["hot_score"] | hot
        if "priority_weights" in overrides:
            update["priority_weights"] = overrides["priority_weights"]
    update["adapter_cache_policy"] = AdapterCachePolicy.model_validate(data)
    return LoRAConfig.model_validate(config.model_dump() | update)


def weighted_defaults(config: LoRAConfig) -> dict[str, Any]:
    """The weighted arm's tunables, as run (recorded beside the tuning seed)."""
    p = config.adapter_cache_policy
    return {
        "hot_score": p.hot_score.model_dump(),
        "qps_window_s": p.qps_window_s,
        "priority_weights": dict(config.priority_weights),
    }
