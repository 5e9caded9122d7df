"""Plain-text report of one ``bench serve`` run."""

from __future__ import annotations

from typing import Any

from kvstack.bench.load.stats import GroupSummary, Percentiles, RunSummary

__all__ = ["fmt", "format_summary"]


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _pct(name: str, p: Percentiles) -> str:
    return (
        f"  {name:<6} mean {fmt(p.mean):>8}  p50 {fmt(p.p50):>8}  p90 {fmt(p.p90):>8}"
        f"  p99 {fmt(p.p99):>8}"
    )


def _group_line(name: str, g: GroupSummary) -> str:
    return (
        f"  {name:<14} n={g.num_requests:<6} errors={g.num_errors:<4} 429={g.num_429:<4} "
        f"ttft p50={fmt(g.ttft_s.p50)} p90={fmt(g.ttft_s.p90)}  "
        f"tpot p50={fmt(g.tpot_s.p50)}  goodput={fmt(g.goodput)}/s"
    )


def _mismatch(g: GroupSummary) -> str:
    num = g.prompt_tokens_mismatched
    return f"; {num} requests with an unexpected prompt token count" if num else ""


def format_summary(document: dict[str, Any], summary: RunSummary) -> str:
    o = summary.overall
    plan, slo = document["plan"], document["slo"]
    load = (
        f"rate {plan['rate']}/s"
        if plan["rate"] is not None
        else f"concurrency {plan['concurrency']}"
    )
    cached = o.cached_tokens / o.prompt_tokens if o.prompt_tokens else 0.0
    lines = [
        f"workload {document['workload']['name']}  {load}  model {document['model']}  "
        f"duration {summary.duration_s:.1f} s (time scale {plan['time_scale']})",
        f"requests {o.num_requests}: ok {o.num_ok}, errors {o.num_errors} "
        f"({o.error_rate:.1%}), 429 {o.num_429} ({o.rate_429:.1%})",
        f"throughput {fmt(o.request_throughput)} req/s, {fmt(o.output_throughput)} output tok/s; "
        f"goodput {fmt(o.goodput)} req/s ({o.slo_attainment:.1%} within SLO ttft<="
        f"{slo['ttft_s']} s, tpot<={slo['tpot_s']} s)",
        f"prompt tokens {o.prompt_tokens}, cached {cached:.1%}" + _mismatch(o),
        "latency (s):",
        _pct("TTFT", o.ttft_s),
        _pct("TPOT", o.tpot_s),
        _pct("ITL", o.itl_s),
        _pct("E2E", o.e2e_s),
    ]
    if summary.errors_by_reason:
        lines.append("errors by reason:")
        lines += [f"  {n:>6}  {reason}" for reason, n in summary.errors_by_reason.items()]
    for title, groups in (("priority", summary.by_priority), ("tenant", summary.by_tenant)):
        if len(groups) > 1 or (groups and title != "priority"):
            lines.append(f"by {title}:")
            lines += [_group_line(k, g) for k, g in groups.items()]
    if summary.by_adapter:
        top = sorted(summary.by_adapter.items(), key=lambda kv: -kv[1].num_requests)[:10]
        lines.append(f"by adapter (top {len(top)} of {len(summary.by_adapter)}):")
        lines += [_group_line(k, g) for k, g in top]
    if summary.by_backend:
        spread = ", ".join(f"{k}: {v}" for k, v in summary.by_backend.items())
        lines.append(f"by backend: {spread}")
    return "\n".join(lines)
