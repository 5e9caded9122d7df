"""``SharedTierLookup``: kvstack tiers (local and shared) per backend, from the cluster index.

One lookup per request (the index server: msgpack, tokens as uint32 bytes, over ZMQ when
``index_url`` is ``zmq://``, else HTTP; Valkey, when it is ``redis://`` or ``rediss://``: one
pipelined round trip, :mod:`kvstack.index.valkey`) answers, for every engine that announces
its kvstack tiers, the prefix length per tier, and per shared store (Redis, S3, a shared
directory) the prefix length held there. A shared store is readable by every engine that
runs kvstack's connector, so its prefix counts for every backend (``shared_for_all``), at that
store's lower credit. An engine announces an instance id; the backend it is: the one whose
name, URL or ``kvstack.io/index-instance`` label equals it. A slow or failing index costs the
request its tier credit, never the request: the lookup is bounded by ``index_timeout_s``. With
the cluster secret (the ``security`` section, ``KVSTACK_SECURITY_CLUSTER_SECRET_FILE``) lookups
to the index server authenticate; an index server that has the secret answers nothing else.
Valkey authenticates with its ACL password and TLS instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from urllib.parse import urlsplit

import httpx
import msgspec

from kvstack.errors import IndexServiceError
from kvstack.index.backend import AsyncIndexBackend, open_async_index
from kvstack.index.client import lookup_request
from kvstack.index.protocol import LookupReply
from kvstack.log import IncidentLogger
from kvstack.metrics import counter
from kvstack.router.fleet.backends import BackendView
from kvstack.router.scheduling.config import PrefixConfig
from kvstack.router.scheduling.tokenizers import PromptTokens
from kvstack.security import ClusterKeys, load_security

__all__ = ["INSTANCE_LABEL", "SharedTierLookup", "tier_kind", "tiers_by_backend"]

log = logging.getLogger(__name__)
incidents = IncidentLogger(log)
INSTANCE_LABEL = "kvstack.io/index-instance"
LOOKUPS = counter(
    "kvstack_router_index_lookups_total", "Lookups at the kvstack index server", ["outcome"]
)


def tier_kind(location: str) -> str:
    """A shared store's tier kind from its location (``redis://...`` -> ``redis``)."""
    scheme = urlsplit(location).scheme
    return {"rediss": "redis", "file": "disk"}.get(scheme, scheme or location)


def tiers_by_backend(
    reply: LookupReply, backends: Sequence[BackendView], shared_for_all: bool
) -> dict[str, dict[str, int]]:
    """backend id -> tier -> matched tokens, from an index reply."""
    names: dict[str, str] = {}
    for b in backends:
        for alias in (b.id, b.url, urlsplit(b.url).netloc, b.backend.labels.get(INSTANCE_LABEL)):
            if alias:
                names[alias] = b.id
    out: dict[str, dict[str, int]] = {}
    for instance, match in reply.instances.items():
        backend_id = names.get(instance)
        if backend_id is not None:
            out[backend_id] = {tier: n for tier, n in match.tiers.items() if n}
    if shared_for_all and reply.shared:
        shared: dict[str, int] = {}
        for location, n in reply.shared.items():
            kind = tier_kind(location)
            shared[kind] = max(shared.get(kind, 0), n)
        for b in backends:
            tiers = out.setdefault(b.id, {})
            for kind, n in shared.items():
                tiers[kind] = max(tiers.get(kind, 0), n)
    return out


class SharedTierLookup:
    def __init__(self, config: PrefixConfig, keys: ClusterKeys | None = None) -> None:
        self.config = config
        self._keys = keys
        self._client: AsyncIndexBackend | None = None

    async def start(self) -> None:
        if self.config.index_url:
            keys = self._keys if self._keys is not None else load_security()[1]
            self._client = open_async_index(
                self.config.index_url, self.config.index_timeout_s, keys
            )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def lookup(
        self, prompt: PromptTokens, backends: Sequence[BackendView]
    ) -> dict[str, dict[str, int]]:
        """Tier matches per backend (empty when the index is off, slow or failing)."""
        if self._client is None or not prompt.exact or not prompt.tokens:
            return {}
        ns = prompt.namespace
        request = lookup_request(ns.model, prompt.tokens, salt=ns.salt, adapter=ns.adapter)
        try:
            reply = await asyncio.wait_for(
                self._client.lookup(request), self.config.index_timeout_s
            )
        except (TimeoutError, httpx.HTTPError, IndexServiceError, msgspec.DecodeError) as exc:
            LOOKUPS.labels("failed").inc()
            incidents.warning("index", "index lookup failed (%s); no tier credit", exc)
            return {}
        LOOKUPS.labels("ok").inc()
        return tiers_by_backend(reply, backends, self.config.shared_for_all)
