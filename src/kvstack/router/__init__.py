"""kvstack.router — the OpenAI-compatible gateway in front of a fleet of engines.

A request's path (each step one module)::

    http.app.RouterApp       http.parse: the body parsed once; http.auth: the API key
      tenancy.Tenancy        the tenant's cache_salt, its priority cap, who sees internals
      Router.resolve_target  scheduling.model_routes: client name -> target (alias, weighted
                             canary); adapters: a registered LoRA adapter -> its base model
      proxy.Proxy            decide -> attempt -> retry, with the scheduling.scheduler:
        admit                admission: priority (hold or shed; backend chosen after it)
        prepare              scheduling.prompts: the prompt as the engine's token ids (worker
                             thread when long); prefix.shared: kvstack tiers from the index
        decide               eligible backends (decode ones for a PD model) -> the pipeline:
                             filters (adapters first) -> weighted scorers -> picker; the
                             default scorer is plugins.cost (predicted TTFT over the prefix
                             state: routed beliefs, KV events, tier credit)
        attempt steps        adapters: load the LoRA adapter on the chosen engine;
                             pd.step: on the first attempt, prefill the prompt elsewhere
        send                 fleet.load: the lease (in-flight request + uncached prefill);
                             upstream.relay: send, wait for the first body byte, commit,
                             stream; a failure before the commit retries on another backend
      observers              dispatch / first token / finish: routed beliefs, TTFT learning,
                             admission room, LoRA in-flight and adapter release
      telemetry              kvstack_router_* metrics; x-kvstack-backend / -decision headers
                             (the decision's details only for privileged callers)

What the stages learn about one request travels in its typed ``RoutingRequest.state``
(:mod:`kvstack.router.request`). Around the path: discovery (static list or Kubernetes) fills
the pool of backends (:mod:`kvstack.router.fleet`), health checks and passive ejection say
which are usable, the scraper corrects the load view with the engines' own metrics (over the
httpx control-plane client, :mod:`kvstack.router.upstream.control`), and one ZMQ subscription
per backend feeds its KV events into the prefix state (:mod:`kvstack.router.prefix`).

Extension points (new files, not changes here): a scorer, filter or picker registered in
:mod:`kvstack.router.scheduling.plugins` (plugins that learn from traffic implement
``RequestObserver``; shared state such as the prefix index or the cost model lives in
``PluginContext.services``, see :mod:`kvstack.router.scheduling.services`); an admission policy
in :data:`kvstack.router.admission.base.ADMISSIONS`; a discovery source in
:data:`kvstack.router.fleet.discovery.DISCOVERY`; a step before each attempt
(:class:`kvstack.router.attempt.AttemptStep`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvstack.router.config import RouterConfig
    from kvstack.router.http.server import build_server
    from kvstack.router.router import Router

__all__ = ["Router", "RouterConfig", "build_server"]

_LAZY = {
    "Router": "kvstack.router.router",
    "RouterConfig": "kvstack.router.config",
    "build_server": "kvstack.router.http.server",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'kvstack.router' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
