"""Scheduling plugins by name: filters, scorers and pickers (see :mod:`.base` for the contract).

A new plugin is one new module plus one ``register`` line here; modules are imported only when
a pipeline names them.
"""

from __future__ import annotations

from kvstack.registry import Registry
from kvstack.router.plugins.base import (
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

FILTERS.register("not_saturated", "kvstack.router.plugins.filters:NotSaturatedFilter")
FILTERS.register("labels", "kvstack.router.plugins.filters:LabelFilter")
SCORERS.register("least_load", "kvstack.router.plugins.load:LeastLoadScorer")
SCORERS.register("session_affinity", "kvstack.router.plugins.session:SessionAffinityScorer")
SCORERS.register("prefix", "kvstack.router.plugins.prefix:PrefixScorer")
SCORERS.register("ttft", "kvstack.router.plugins.cost:TTFTScorer")
SCORERS.register("lora_affinity", "kvstack.router.plugins.lora:LoRAAffinityScorer")
PICKERS.register("max_score", "kvstack.router.plugins.pickers:MaxScorePicker")
PICKERS.register("random", "kvstack.router.plugins.pickers:RandomPicker")
PICKERS.register("weighted_random", "kvstack.router.plugins.pickers:WeightedRandomPicker")
PICKERS.register("softmax", "kvstack.router.plugins.pickers:SoftmaxPicker")
