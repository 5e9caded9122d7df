"""Summaries of a run: latency percentiles, throughput, goodput under an SLO, error rates,
overall and per priority class, adapter, tenant tier and backend.

Goodput counts the requests that succeeded *and* met the SLO (TTFT at most ``ttft_s``, time
per output token at most ``tpot_s``), per second of the run. All times are in the unit of
the results (simulated seconds when the load generator was given a time scale).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the lean router load generator imports `percentile`
    from kvstack.bench.load.client import RequestResult

__all__ = ["SLO", "GroupSummary", "Percentiles", "RunSummary", "percentile", "summarize"]


@dataclass(frozen=True, slots=True)
class SLO:
    ttft_s: float | None = None
    tpot_s: float | None = None

    def met(self, r: RequestResult) -> bool:
        if not r.ok:
            return False
        if self.ttft_s is not None and (r.ttft_s is None or r.ttft_s > self.ttft_s):
            return False
        tpot = r.tpot_s
        return self.tpot_s is None or tpot is None or tpot <= self.tpot_s


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, linearly interpolated between the two
    nearest ranks (numpy's default, as ``vllm bench serve`` reports); None for no values.

    Every benchmark's percentiles come from here, so figures from different benchmarks are
    computed alike."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True, slots=True)
class Percentiles:
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        mean = sum(values) / len(values) if values else None
        return cls(mean, percentile(values, 50), percentile(values, 90), percentile(values, 99))


@dataclass(frozen=True, slots=True)
class GroupSummary:
    num_requests: int
    num_ok: int
    num_errors: int
    num_429: int
    error_rate: float
    rate_429: float
    request_throughput: float  # completed requests per second
    output_throughput: float  # output tokens per second
    goodput: float  # requests meeting the SLO per second
    slo_attainment: float  # fraction of requests meeting the SLO
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttft_s: Percentiles
    tpot_s: Percentiles
    itl_s: Percentiles
    e2e_s: Percentiles
    prompt_tokens_mismatched: int  # usage.prompt_tokens != expected (exactness check)


@dataclass(frozen=True, slots=True)
class RunSummary:
    duration_s: float
    overall: GroupSummary
    by_priority: dict[str, GroupSummary] = field(default_factory=dict)
    by_adapter: dict[str, GroupSummary] = field(default_factory=dict)
    by_tenant: dict[str, GroupSummary] = field(default_factory=dict)
    by_backend: dict[str, int] = field(default_factory=dict)
    errors_by_reason: dict[str, int] = field(default_factory=dict)  # error_reason -> count

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _group(results: Sequence[RequestResult], duration_s: float, slo: SLO) -> GroupSummary:
    ok = [r for r in results if r.ok]
    n = len(results)
    met = sum(1 for r in results if slo.met(r))
    num_429 = sum(1 for r in results if r.status == 429)
    output = sum(r.output_tokens for r in ok)
    per_s = 1.0 / duration_s if duration_s > 0 else 0.0
    return GroupSummary(
        num_requests=n,
        num_ok=len(ok),
        num_errors=n - len(ok),
        num_429=num_429,
        error_rate=(n - len(ok)) / n if n else 0.0,
        rate_429=num_429 / n if n else 0.0,
        request_throughput=len(ok) * per_s,
        output_throughput=output * per_s,
        goodput=met * per_s,
        slo_attainment=met / n if n else 0.0,
        prompt_tokens=sum(r.prompt_tokens or 0 for r in ok),
        cached_tokens=sum(r.cached_tokens or 0 for r in ok),
        output_tokens=output,
        ttft_s=Percentiles.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_s=Percentiles.of([t for r in ok if (t := r.tpot_s) is not None]),
        itl_s=Percentiles.of([gap for r in ok for gap in r.itl_s]),
        e2e_s=Percentiles.of([r.e2e_s for r in ok if r.e2e_s is not None]),
        prompt_tokens_mismatched=sum(
            1
            for r in ok
            if r.expected_prompt_tokens is not None
            and r.prompt_tokens is not None
            and r.prompt_tokens != r.expected_prompt_tokens
        ),
    )


def _by(
    results: Iterable[RequestResult], key: Callable[[RequestResult], str | None]
) -> dict[str, list[RequestResult]]:
    groups: dict[str, list[RequestResult]] = defaultdict(list)
    for r in results:
        k = key(r)
        if k is not None:
            groups[k].append(r)
    return dict(groups)


def summarize(results: Sequence[RequestResult], duration_s: float, slo: SLO) -> RunSummary:
    def each(key: Callable[[RequestResult], str | None]) -> dict[str, GroupSummary]:
        return {k: _group(v, duration_s, slo) for k, v in sorted(_by(results, key).items())}

    backends = _by(results, lambda r: r.backend)
    return RunSummary(
        duration_s=duration_s,
        overall=_group(results, duration_s, slo),
        by_priority=each(lambda r: r.priority),
        by_adapter=each(lambda r: r.adapter),
        by_tenant=each(lambda r: r.tenant),
        by_backend={k: len(v) for k, v in sorted(backends.items())},
        errors_by_reason=_errors_by_reason(results),
    )


def error_reason(result: RequestResult) -> str:
    """A failed request's reason by type: ``HTTP 404: <the server's message>``, the client's
    exception type (no response), or what the stream lacked."""
    error = (result.error or "").strip()
    if result.status == 0:
        return error.partition(":")[0] or "no response"
    if result.status != 200:
        return f"HTTP {result.status}: {error[:120]}" if error else f"HTTP {result.status}"
    return f"stream: {error[:120]}" if error else "stream: no token received"


def _errors_by_reason(results: Sequence[RequestResult]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for result in results:
        if not result.ok:
            reason = error_reason(result)
            counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
