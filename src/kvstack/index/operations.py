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

__all__ = ["REFUSED", "Operation", "Refusal", "count_request", "refused"]

_REQUESTS = counter("kvstack_index_requests_total", "Index server requests", ["route", "status"])
_REFUSALS = counter(
    "kvstack_index_refused_total",
    "Index requests refused before they were answered, by reason: auth (no or a wrong "
    "credential), identity (a report for another instance), size (body, frame, keys), full "
    "(too many instances), invalid (undecodable or out-of-range fields)",
    ["reason"],
)


class Refusal(Exception):
    """A request refused for who sent it or how big it is: ``status`` is the HTTP status
    (also the ZMQ status frame), ``reason`` the label it is counted under."""

    def __init__(self, message: str, status: int, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def refused(reason: str) -> None:
    _REFUSALS.labels(reason).inc()


# What a request may raise that makes it invalid (answered 400 with the message), not the server.
REFUSED = (msgspec.DecodeError, msgspec.ValidationError, ConfigError, ValueError)


class Operation(NamedTuple):
    """A request type and what answers it: the same over HTTP and ZMQ."""

    kind: type[Any]
    answer: Callable[[Any], Any]


def count_request(route: str, status: str) -> None:
    _REQUESTS.labels(route, status).inc()
