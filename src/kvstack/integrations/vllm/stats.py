"""Connector statistics, carried from the worker and scheduler to vLLM's API server process.

vLLM collects ``get_kv_connector_stats()`` from every worker and the scheduler each step,
aggregates them, and hands them to the Prometheus metrics this module registers in the API
server's registry, so they appear on the engine's own ``/metrics`` next to ``vllm:*``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)

__all__ = ["COUNTERS", "KVStackPromMetrics", "KVStackStats"]

# name -> help. Counters are sums over the interval; *_seconds also feed histograms.
COUNTERS: dict[str, str] = {
    "lookup_tokens": "Prompt tokens looked up in kvstack beyond the engine's own prefix hit",
    "hit_tokens": "Tokens kvstack could load (the engine computed the rest)",
    "load_tokens": "Tokens loaded into the engine's KV cache",
    "load_bytes": "Bytes loaded into the engine's KV cache",
    "load_failed_chunks": "Chunks that failed to load (recomputed instead)",
    "lookup_deferrals": "Scheduler steps a request waited for its prefix lookup's answer "
    "(the others kept stepping)",
    "async_loads": "Loads that ran off the step while the request waited (slow tiers)",
    "sync_loads": "Loads done within the step (in-memory chunks, or a load cheaper there)",
    "cost_sync_loads": "Loads from slower tiers done within the step because load_mode=auto "
    "measured them cheaper there than off it",
    "deferred_write_chunks": "Chunks of asynchronous loads fetched off the step and written in "
    "the next step, beside its forward pass (vLLM's CPU build)",
    "finish_waits": "Asynchronous loads a step's end waited for, predicted to finish within "
    "the wait (load_finish_wait)",
    "finish_wait_caught": "Of those, the loads that finished within the wait (reported a step "
    "sooner)",
    "helper_fetched_chunks": "Chunks of asynchronous loads read by the fetch helper process "
    "(load_fetch=process)",
    "load_timeouts": "Asynchronous loads abandoned at load_timeout_s (recomputed instead)",
    "save_chunks": "Chunks copied out of the engine into kvstack",
    "save_bytes": "Bytes copied out of the engine into kvstack",
    "save_skipped_chunks": "Chunks not copied because kvstack already held them",
    "save_generated_chunks": "Saved chunks holding generated tokens (next turns, preemption)",
    "held_requests": "Finished requests whose blocks waited for their copy-out to finish",
    "preempted_requests": "Requests the engine preempted (freed their KV to make room)",
    "resumed_requests": "Preempted requests the engine scheduled again",
    "preemption_recoveries": "Resumptions of preempted requests that loaded KV from kvstack",
    "preemption_recovered_tokens": "Tokens of preempted requests loaded instead of recomputed",
    "recomputed_tokens": "Tokens computed again for requests that had computed them before",
}
HISTOGRAMS: dict[str, str] = {
    "load_seconds": "Time the engine step waited for kvstack loads",
    "lookup_seconds": "Question to answer of the workers' prefix lookups (the scheduler "
    "waits at most 2 ms per step for one; the request waits the rest)",
    "async_load_seconds": "Start to finish of asynchronous loads (off the step)",
    "async_fetch_seconds": "Start of asynchronous loads to their threads being done (fetched, "
    "and written unless the next step writes them); async_load_seconds adds the wait for the "
    "step that reports them",
    "finish_wait_seconds": "Time a step's end waited for asynchronous loads about to finish",
    "save_seconds": "Time the engine step spent copying KV out to kvstack",
    "hold_seconds": "Extra time finished requests' blocks stayed allocated for copy-outs",
    "step_interval_seconds": "Scheduler step to the next, both running a continuing request "
    "(its inter-token latency when decoding), with no asynchronous load in flight",
    "loading_step_interval_seconds": "Scheduler step to the next, both running a continuing "
    "request, with asynchronous loads in flight: what loading off the step costs the batch",
}
# Step intervals get fine buckets, as percentiles of decode steps need (a CPU engine's decode
# steps take a few ms): 0.5 ms steps to 20 ms, 2.5 ms to 50 ms, then coarser to 10 s.
STEP_INTERVALS = ("step_interval_seconds", "loading_step_interval_seconds")
_STEP_BUCKETS = tuple(
    round(b, 4)
    for b in (
        *(n * 0.0005 for n in range(1, 41)),
        *(0.02 + n * 0.0025 for n in range(1, 13)),
        0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0,
    )
)  # fmt: skip
TIER_COUNTERS = (
    "hits", "misses", "bytes_read", "bytes_written",
    "evictions", "corrupt", "dropped_writes", "errors",
)  # fmt: skip
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class KVStackStats(KVConnectorStats):
    data: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.data[name] = self.data.get(name, 0) + value

    def observe(self, name: str, seconds: float) -> None:
        self.data.setdefault(name, []).append(seconds)

    def set_gauge(self, name: str, value: float) -> None:
        self.data[f"gauge:{name}"] = value

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVStackStats:
        for name, value in other.data.items():
            if isinstance(value, list):
                self.data.setdefault(name, []).extend(value)
            elif name.startswith("gauge:"):
                self.data[name] = value  # the latest reading wins
            else:
                self.add(name, value)
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {}
        for name, value in self.data.items():
            out[name] = sum(value) if isinstance(value, list) else value
        return out

    def is_empty(self) -> bool:
        # Gauges count as content: they are only set when they have something new to say.
        return not any(v or k.startswith("gauge:") for k, v in self.data.items())


class KVStackPromMetrics(KVConnectorPromMetrics):
    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        # vLLM hands over its (multiprocess-aware) metric classes; typed loosely on purpose.
        counter_cls, gauge_cls = cast(Any, self._counter_cls), cast(Any, self._gauge_cls)
        histogram_cls = cast(Any, self._histogram_cls)
        self._counters: dict[str, Any] = {
            name: counter_cls(
                name=f"kvstack_connector_{name}", documentation=doc, labelnames=labelnames
            )
            for name, doc in COUNTERS.items()
        }
        self._tier_counters: dict[str, Any] = {
            name: counter_cls(
                name=f"kvstack_connector_tier_{name}",
                documentation=f"kvstack tier {name.replace('_', ' ')} (worker processes)",
                labelnames=[*labelnames, "tier"],
            )
            for name in TIER_COUNTERS
        }
        self._tier_gauges: dict[str, Any] = {
            name: gauge_cls(
                name=f"kvstack_connector_tier_{name}",
                documentation=f"kvstack tier {name.replace('_', ' ')} (worker processes)",
                labelnames=[*labelnames, "tier"],
                multiprocess_mode="mostrecent",
            )
            for name in ("used_bytes", "entries")
        }
        self._tracked = gauge_cls(
            name="kvstack_connector_tracked_requests",
            documentation="Requests the connector's scheduler side holds state for",
            labelnames=labelnames,
            multiprocess_mode="mostrecent",
        )
        self._histograms: dict[str, Any] = {
            name: histogram_cls(
                name=f"kvstack_connector_{name}",
                documentation=doc,
                labelnames=labelnames,
                buckets=_STEP_BUCKETS if name in STEP_INTERVALS else _BUCKETS,
            )
            for name, doc in HISTOGRAMS.items()
        }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        labels = self.per_engine_labelvalues[engine_idx]
        for name, value in transfer_stats_data.items():
            kind, _, rest = name.partition(":")
            if kind == "tier":
                tier, _, counter = rest.partition(":")
                self._tier_counters[counter].labels(*labels, tier).inc(value)
            elif name == "gauge:tracked_requests":
                self._tracked.labels(*labels).set(value)
            elif kind == "gauge":
                _, tier, gauge = rest.split(":")
                self._tier_gauges[gauge].labels(*labels, tier).set(value)
            elif name in self._counters and value:
                self._counters[name].labels(*labels).inc(value)
            elif name in self._histograms:
                for seconds in value:
                    self._histograms[name].labels(*labels).observe(seconds)
