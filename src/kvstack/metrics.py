"""Shared Prometheus helpers.

Metrics are created through :func:`counter`, :func:`gauge` and :func:`histogram`, which return
the existing collector when the same name is requested again (modules imported twice, several
caches in one process), so every component can declare its metrics at import time.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

__all__ = [
    "BYTES_BUCKETS",
    "LATENCY_BUCKETS_S",
    "counter",
    "gauge",
    "histogram",
    "registered_metric_names",
]

# From 50 µs (a DRAM hit) to 60 s (a cold prefill or adapter load on a CPU).
LATENCY_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
BYTES_BUCKETS = tuple(float(4**i) for i in range(5, 16))

_lock = threading.Lock()
_metrics: dict[str, MetricWrapperBase] = {}
M = TypeVar("M", bound=MetricWrapperBase)


def _get_or_create(cls: type[M], name: str, doc: str, labels: Sequence[str], **kw: Any) -> M:
    with _lock:
        existing = _metrics.get(name)
        if existing is not None:
            if not isinstance(existing, cls):
                raise ValueError(f"metric {name!r} already exists as {type(existing).__name__}")
            return existing
        metric = cls(name, doc, labelnames=tuple(labels), registry=REGISTRY, **kw)
        _metrics[name] = metric
        return metric


def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
    return _get_or_create(Counter, name, doc, labels)


def gauge(name: str, doc: str, labels: Sequence[str] = (), **kw: Any) -> Gauge:
    return _get_or_create(Gauge, name, doc, labels, **kw)


def histogram(
    name: str, doc: str, labels: Sequence[str] = (), buckets: Sequence[float] = LATENCY_BUCKETS_S
) -> Histogram:
    return _get_or_create(Histogram, name, doc, labels, buckets=tuple(buckets))


def registered_metric_names(registry: CollectorRegistry = REGISTRY) -> set[str]:
    """Every sample name the registry can export (``_total``, ``_bucket``… included)."""
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names
