"""What the index answers, independent of the transport: the HTTP routes
(:mod:`kvstack.index.service`) and the ZMQ endpoint (:mod:`kvstack.index.zmq_server`) both serve a
table of :class:`Operation` values, refuse the same request errors (:data:`REFUSED`) and count
requests in one metric."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from kvstack.errors import ConfigError
from kvstack.metrics import counter

__all__ = ["REFUSED", "Operation", "count_request"]

_REQUESTS = counter("kvstack_index_requests_total", "Index server requests", ["route", "status"])

# What a request may raise that makes it invalid (answered 400 with the message), not the server.
REFUSED = (msgspec.DecodeError, msgspec.ValidationError, ConfigError, ValueError)


class Operation(NamedTuple):
    """A request type and what answers it: the same over HTTP and ZMQ."""

    kind: type[Any]
    answer: Callable[[Any], Any]


def count_request(route: str, status: str) -> None:
    _REQUESTS.labels(route, status).inc()
