"""``build_epp``: the EPP's parts from the ``router``, ``epp`` and ``security`` sections.

The router is the one ``kvstack router`` builds (same pipeline, admission, prefix state, LoRA
control plane); with ``epp.pool.name`` its discovery is the InferencePool's, and the pool's
InferenceObjectives (and, when asked, InferenceModels) are followed into an
:class:`~kvstack.router.epp.objectives.ObjectiveBook`: priorities for admission, weighted
routes added to the router's model routes (the configured routes win on a name clash).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvstack.router.config import RouterConfig
from kvstack.router.epp.config import EppConfig
from kvstack.router.epp.kube import ResourceKind, ResourceWatch, Snapshot
from kvstack.router.epp.objectives import ObjectiveBook
from kvstack.router.epp.server import EppServer
from kvstack.router.fleet.discovery.base import Discovery
from kvstack.router.router import Router
from kvstack.security import SecurityConfig, load_keys

if TYPE_CHECKING:
    from kvstack.lora.control import LoRAControl

__all__ = ["build_epp"]


def build_epp(
    router_config: RouterConfig,
    config: EppConfig,
    security: SecurityConfig | None = None,
    lora: LoRAControl | None = None,
    api_client: Any = None,
) -> EppServer:
    """An unstarted :class:`EppServer` (``api_client``: a Kubernetes ApiClient, for tests)."""
    security = security or SecurityConfig()
    pool = config.pool
    discovery: Discovery | None = None
    if pool.name is not None:
        from kvstack.router.epp.pool import InferencePoolDiscovery

        discovery = InferencePoolDiscovery(pool, api_client)
    router = Router(router_config, discovery=discovery, lora=lora)
    book = ObjectiveBook(pool.name)
    watches: list[ResourceWatch] = []
    if pool.name is not None and pool.objectives:
        kind = ResourceKind("InferenceObjective", pool.objective_api_version, "inferenceobjectives")
        watches.append(ResourceWatch(kind, pool, book.apply_objectives, api_client))
    if pool.name is not None and pool.inference_models:
        kind = ResourceKind("InferenceModel", pool.inference_model_api_version, "inferencemodels")
        static = dict(router.models.routes)

        def models(snapshot: Snapshot) -> None:
            book.apply_inference_models(snapshot)
            router.models.routes = {**book.routes, **static}

        watches.append(ResourceWatch(kind, pool, models, api_client))
    return EppServer(router, config, security, load_keys(security), book, watches)
