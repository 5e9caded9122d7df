"""Shared services of the scheduling plugins, created on first use in ``PluginContext.services``.

Several plugins share one instance of each (the prefix state with its radix index and event
subscriptions; the cost model that learns from observed TTFTs). The router starts every
service found there before the first request (and closes them at the end), runs their
``prepare`` after admission, and feeds them request outcomes when they observe requests.
Outside a router (unit tests) they work without a pool or start.
"""

from __future__ import annotations

from collections.abc import Callable

from kvstack.router.prefix.state import PrefixState
from kvstack.router.scheduling.config import PrefixConfig
from kvstack.router.scheduling.cost_model import CostModel
from kvstack.router.scheduling.plugins.base import PluginContext

__all__ = ["cost_model", "prefix_state"]


def prefix_state(context: PluginContext) -> PrefixState:
    state = context.services.get("prefix")
    if state is None:
        config = context.config.prefix if context.config is not None else PrefixConfig()
        state = context.services["prefix"] = PrefixState(config, context.pool)
    assert isinstance(state, PrefixState)
    return state


def cost_model(context: PluginContext, make: Callable[[], CostModel] = CostModel) -> CostModel:
    """The shared cost model (``make`` builds it when this call is the first)."""
    model = context.services.get("cost_model")
    if model is None:
        model = context.services["cost_model"] = make()
    assert isinstance(model, CostModel)
    return model
