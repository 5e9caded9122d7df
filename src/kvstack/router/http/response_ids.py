"""``ResponseLedger``: which backend holds each Responses API response the router relayed.

vLLM keeps a stored response (``VLLM_ENABLE_RESPONSES_API_STORE``) in the API server process
that made it, so ``GET /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel`` and a new
response continuing it (``previous_response_id``) must reach that engine. The router reads the
id from the first bytes of the answer (a JSON body, or a stream's ``response.created`` event),
which it holds anyway, and remembers ``id -> (backend, model)`` in a bounded LRU map: memory
stays bounded whatever the traffic, and the oldest ids are forgotten first (a forgotten or
unknown id gets a 404 in vLLM's words). An id is found only for the tenant that made it.
Routers behind one load balancer do not share it: pin Responses clients to one router
(session affinity) when they use stored responses.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import NamedTuple

__all__ = ["ResponseLedger", "StoredResponse"]

# vLLM names responses "resp_<hex>"; the first such id in an answer is the response's own
# (its output items are "msg_...", "fc_...", "rs_...").
_ID = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_\-]{1,128})"')


class StoredResponse(NamedTuple):
    backend_id: str
    model: str  # the target the backend served it as
    tenant: str | None  # only the tenant that made it may read, cancel or continue it


class ResponseLedger:
    def __init__(self, capacity: int = 65536) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def remember(
        self, first_bytes: bytes, backend_id: str, model: str, tenant: str | None
    ) -> str | None:
        """Note the response id in an answer's first bytes; the id, or None if none is there."""
        match = _ID.search(first_bytes)
        if match is None:
            return None
        response_id = match.group(1).decode()
        self._entries[response_id] = StoredResponse(backend_id, model, tenant)
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return response_id

    def find(self, response_id: str) -> StoredResponse | None:
        """Where ``response_id`` lives, if the router relayed it and still remembers it."""
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry
