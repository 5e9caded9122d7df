"""The printed plan: the inputs that matter, the numbers behind the answer, the answer."""

from __future__ import annotations

from kvstack.bench.plan.decide import Plan
from kvstack.bench.plan.model import GIB, Hardware, PlanModelShape, WorkloadShape, prefill_s
from kvstack.bench.plan.options import LABELS

__all__ = ["format_plan", "plan_document"]


def _tokens(value: float | None) -> str:
    return "never" if value is None else f"{value:,.0f} tokens"


def _footprint(model: PlanModelShape, hw: Hardware, wl: WorkloadShape, plan: Plan) -> list[str]:
    e = plan.evaluation
    b, hbm = e.kv_bytes_per_token, e.tiers["hbm"].capacity_tokens
    reused = wl.reused_tokens
    return [
        f"KV per token: {b / 1024:,.1f} KiB ({model.num_layers} layers x {model.num_kv_heads} KV "
        f"heads x {model.head_dim} x {model.dtype_bytes:g} B x 2); a reused prefix of "
        f"{reused:,.0f} tokens is {reused * b / 1e6:,.0f} MB",
        f"HBM KV cache per engine: {hbm:,.0f} tokens ({hbm * b / GIB:,.1f} GiB); running requests "
        f"hold {wl.hbm_kv_usage:.0%}, leaving {e.free_hbm_tokens:,.0f} for cached prefixes",
        f"workload: {wl.rate_per_s * 3600:,.0f} requests/hour over {hw.num_engines} engine(s) "
        f"({wl.routing} routing); prompts of {wl.prompt_tokens:,} tokens, {reused:,.0f} of them a "
        f"reused prefix ({wl.groups:,.0f} distinct, {wl.working_set:,.0f} tokens); "
        f"{wl.preemptions_per_hour:,.0f} preemptions/hour",
    ]


def _loads(hw: Hardware, wl: WorkloadShape, plan: Plan) -> list[str]:
    e = plan.evaluation
    reused = wl.reused_tokens
    lines = [
        "",
        f"shortest context for which a load pays (fixed cost per load "
        f"{hw.fixed_load_s * 1e3:.1f} ms = {hw.load_fixed_s * 1e3:.1f} ms lookup and launch + "
        f"{hw.load_wait_s * 1e3:.1f} ms waiting for the engine step, plus the tier's latency):",
    ]
    for name in ("cpu", "disk", "remote"):
        tier = e.tiers[name]
        per_token_ms = e.kv_bytes_per_token / tier.bytes_per_s * 1e3
        load = tier.load_s(reused, e.kv_bytes_per_token, hw.fixed_load_s)
        lines.append(
            f"  {name:<6} {tier.bytes_per_s / 1e9:6.2f} GB/s: {_tokens(e.break_even[name])} "
            f"({per_token_ms:.4f} ms per token loaded against {1e3 / hw.prefill_tokens_per_s:.4f}"
            f" ms to compute; the reused prefix: load {load:.3f} s, recompute "
            f"{prefill_s(hw, 0, reused):.3f} s)"
        )
    return lines


def _options(plan: Plan) -> list[str]:
    e = plan.evaluation
    baseline = e.baseline_prefill_s_per_hour
    lines = [
        "",
        f"per hour: {baseline:,.0f} s of prefill with vLLM's prefix cache alone, which serves "
        f"{e.hbm_hit:.0%} of reused prefixes from HBM ({e.hbm_tokens_saved_per_hour:,.0f} "
        "tokens not recomputed)",
        "| option | offload hits | prefill tokens not recomputed/hour | prefill s saved/hour "
        "| share |",
        "|---|---|---|---|---|",
    ]
    for name in ("native", "local", "shared"):
        o = e.options[name]
        if not o.available:
            lines.append(f"| {o.label} | not available: {o.why_not} | | | |")
            continue
        hits = ", ".join(f"{tier} {share:.0%}" for tier, share in o.hits.items()) or "-"
        share = o.seconds_saved_per_hour / baseline if baseline else 0.0
        lines.append(
            f"| {o.label} | {hits} | {o.tokens_saved_per_hour:,.0f} | "
            f"{o.seconds_saved_per_hour:,.0f} | {share:.1%} |"
        )
    return lines


def _preemptions(wl: WorkloadShape, plan: Plan) -> list[str]:
    if not wl.preemptions_per_hour:
        return []
    options = plan.evaluation.options
    lost = wl.prompt_tokens + wl.output_tokens / 2
    recovered = ", ".join(
        f"{o.label} {o.preempted_tokens_recovered_per_hour:,.0f}"
        for o in options.values()
        if o.available and o.name != "neither"
    )
    return [
        f"preemptions: {wl.preemptions_per_hour:,.0f}/hour, each losing ~{lost:,.0f} tokens of "
        "KV that vLLM recomputes; native offload keeps them all, kvstack the prompt's full "
        f"chunks; tokens recovered per hour: {recovered or 'none'}"
    ]


def _verdict(plan: Plan) -> list[str]:
    usage = plan.break_even_hbm_usage
    if usage is None:
        hbm = "break-even HBM utilisation: none; no offload option pays even at 99.9% KV usage"
    elif usage == 0:
        hbm = "break-even HBM utilisation: 0%; offloading pays even on an idle engine"
    else:
        hbm = (
            f"break-even HBM utilisation: offloading pays once running requests hold more than "
            f"{usage:.1%} of the HBM KV cache (vllm:kv_cache_usage_perc)"
        )
    lines = ["", hbm, "", f"recommendation: {LABELS[plan.recommendation]}: {plan.reason}."]
    if not plan.decisive:
        lines.append("no missing input changes this answer within its plausible range.")
    for d in plan.decisive:
        others = "; ".join(f"at {_value(v)} it is {LABELS[a]}" for v, a in d.alternatives)
        lines.append(
            f"decided by a missing input: {d.flag} (assumed {_value(d.assumed)}): {others}. "
            f"Give {d.flag} to settle it."
        )
    return lines


def _value(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def format_plan(model: PlanModelShape, hw: Hardware, wl: WorkloadShape, plan: Plan) -> str:
    return "\n".join(
        [*_footprint(model, hw, wl, plan), *_loads(hw, wl, plan), *_options(plan),
         *_preemptions(wl, plan), *_verdict(plan)]
    )  # fmt: skip


def plan_document(plan: Plan) -> dict[str, object]:
    """The plan's figures as JSON-able values."""
    e = plan.evaluation
    return {
        "recommendation": plan.recommendation,
        "reason": plan.reason,
        "break_even_hbm_usage": plan.break_even_hbm_usage,
        "shortest_load_tokens": e.break_even,
        "hbm_hit": e.hbm_hit,
        "baseline_prefill_s_per_hour": e.baseline_prefill_s_per_hour,
        "options": {
            name: {
                "available": o.available,
                "why_not": o.why_not,
                "hits": o.hits,
                "prefill_tokens_saved_per_hour": o.tokens_saved_per_hour,
                "prefill_s_saved_per_hour": o.seconds_saved_per_hour,
                "preempted_tokens_recovered_per_hour": o.preempted_tokens_recovered_per_hour,
            }
            for name, o in e.options.items()
            if name != "neither"
        },
        "decided_by_missing": [
            {
                "input": f"{d.section}.{d.name}",
                "assumed": d.assumed,
                "alternatives": [list(a) for a in d.alternatives],
            }
            for d in plan.decisive
        ],
    }
