"""Scheduling plugins by name: filters, scorers and pickers (see :mod:`.base` for the contract).

A new plugin is one new module plus one ``register`` line here; modules are imported only when
a pipeline names them.
"""

from __future__ import annotations

from kvstack.registry import Registry
from kvstack.router.scheduling.plugins.base import (
    Candidate,
    Filter,
    Picker,
    Plugin,
    PluginContext,
    RequestObserver,
    RequestPreparer,
    Scorer,
    ScoreResult,
)

__all__ = [
    "FILTERS",
    "PICKERS",
    "SCORERS",
    "Candidate",
    "Filter",
    "Picker",
    "Plugin",
    "PluginContext",
    "RequestObserver",
    "RequestPreparer",
    "ScoreResult",
    "Scorer",
]

FILTERS: Registry[type[Filter]] = Registry("filter")
SCORERS: Registry[type[Scorer]] = Registry("scorer")
PICKERS: Registry[type[Picker]] = Registry("picker")

FILTERS.register("not_saturated", "kvstack.router.scheduling.plugins.filters:NotSaturatedFilter")
FILTERS.register("labels", "kvstack.router.scheduling.plugins.filters:LabelFilter")
SCORERS.register("least_load", "kvstack.router.scheduling.plugins.load:LeastLoadScorer")
SCORERS.register(
    "session_affinity", "kvstack.router.scheduling.plugins.session:SessionAffinityScorer"
)
SCORERS.register("prefix", "kvstack.router.scheduling.plugins.prefix:PrefixScorer")
SCORERS.register("ttft", "kvstack.router.scheduling.plugins.cost:TTFTScorer")
SCORERS.register("lora_affinity", "kvstack.router.scheduling.plugins.lora:LoRAAffinityScorer")
PICKERS.register("max_score", "kvstack.router.scheduling.plugins.pickers:MaxScorePicker")
PICKERS.register("random", "kvstack.router.scheduling.plugins.pickers:RandomPicker")
PICKERS.register(
    "weighted_random", "kvstack.router.scheduling.plugins.pickers:WeightedRandomPicker"
)
PICKERS.register("softmax", "kvstack.router.scheduling.plugins.pickers:SoftmaxPicker")
