"""Percentiles, goodput under an SLO, error and 429 rates, per-class breakdowns."""

from __future__ import annotations

import pytest

from kvstack.bench.load.client import RequestResult
from kvstack.bench.load.stats import SLO, percentile, summarize


def ok(ttft: float, e2e: float, tokens: int, **kw: object) -> RequestResult:
    return RequestResult(
        0.0,
        ok=True,
        status=200,
        ttft_s=ttft,
        e2e_s=e2e,
        output_tokens=tokens,
        prompt_tokens=100,
        cached_tokens=25,
        **kw,
    )  # type: ignore[arg-type]


def test_percentile_interpolates_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile([], 50) is None


def test_goodput_counts_requests_within_the_slo() -> None:
    results = [
        ok(0.5, 1.5, 11),  # tpot 0.1
        ok(3.0, 4.0, 11),  # ttft too slow
        ok(0.5, 5.5, 11),  # tpot 0.5: too slow
        RequestResult(0.0, status=429, error="shed"),
    ]
    s = summarize(results, duration_s=2.0, slo=SLO(ttft_s=1.0, tpot_s=0.2)).overall
    assert s.num_requests == 4 and s.num_ok == 3 and s.num_429 == 1
    assert s.goodput == 0.5 and s.slo_attainment == 0.25
    assert s.request_throughput == 1.5 and s.output_throughput == 33 / 2
    assert s.error_rate == 0.25 and s.rate_429 == 0.25
    assert s.tpot_s.p50 == pytest.approx(0.1)
    assert s.cached_tokens == 75 and s.prompt_tokens == 300


def test_breakdowns_by_priority_adapter_tenant_backend() -> None:
    results = [
        ok(0.1, 1.0, 5, priority="critical", adapter="a", tenant="premium", backend="b1"),
        ok(0.2, 1.0, 5, priority="sheddable", adapter="b", tenant="free", backend="b2"),
        ok(0.3, 1.0, 5, priority="critical", adapter="a", tenant="premium", backend="b1"),
    ]
    s = summarize(results, 1.0, SLO())
    assert s.by_priority["critical"].num_requests == 2
    assert s.by_adapter["b"].ttft_s.p50 == 0.2
    assert set(s.by_tenant) == {"premium", "free"}
    assert s.by_backend == {"b1": 2, "b2": 1}


def test_prompt_token_mismatches_are_counted() -> None:
    r = ok(0.1, 1.0, 5)
    r.expected_prompt_tokens = 99
    assert summarize([r], 1.0, SLO()).overall.prompt_tokens_mismatched == 1


def test_errors_are_counted_by_reason() -> None:
    results = [
        RequestResult(0.0, status=404, error="The model `x` does not exist."),
        RequestResult(0.0, status=404, error="The model `x` does not exist."),
        RequestResult(0.0, status=0, error="ClientConnectorError: Cannot connect to host"),
        RequestResult(0.0, status=200),  # the stream ended without a token
        ok(0.1, 0.2, 5),
    ]
    reasons = summarize(results, 1.0, SLO(1.0, 1.0)).errors_by_reason
    assert reasons == {
        "HTTP 404: The model `x` does not exist.": 2,
        "ClientConnectorError": 1,
        "stream: no token received": 1,
    }
