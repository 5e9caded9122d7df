"""kvstack.router — the OpenAI-compatible gateway in front of a fleet of engines.

A request's path (each step one module)::

    app.RouterApp            parse the body once (request), check the API key (auth)
      model_routes           client model name -> target (alias, weighted canary, adapter)
      proxy.Proxy            admission.admit (hold or shed; the backend is chosen after it)
        pipeline             eligible backends -> filters -> weighted scorers -> picker
        load                 the lease: in-flight request + prefill tokens, counted at once
        relay.Relay          upstream_pool: send, wait for the first body byte, commit,
                             stream; a failure before the commit retries on another backend
      telemetry              kvstack_router_* metrics; x-kvstack-backend / -decision headers

Around it: discovery (static list or Kubernetes) fills the pool of backends, health checks
and passive ejection say which are usable, the scraper corrects the load view with the
engines' own metrics.

Extension points (new files, not changes here): a scorer, filter or picker registered in
:mod:`kvstack.router.plugins` (plugins that learn from traffic implement
``RequestObserver``; shared state such as a prefix index or a tokenizer goes into
``PluginContext.services``); an admission policy registered in
:data:`kvstack.router.admission.ADMISSIONS`; a discovery source in
:data:`kvstack.router.discovery.DISCOVERY`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvstack.router.config import RouterConfig
    from kvstack.router.router import Router
    from kvstack.router.server import build_server

__all__ = ["Router", "RouterConfig", "build_server"]

_LAZY = {
    "Router": "kvstack.router.router",
    "RouterConfig": "kvstack.router.config",
    "build_server": "kvstack.router.server",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'kvstack.router' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
