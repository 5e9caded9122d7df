"""One recommendation, the HBM usage at which offloading starts to pay, and the missing input
that decided the answer.

The recommendation is the option that saves the most prefill time per hour (loads paid for),
unless none saves ``MIN_SAVING`` of the baseline's prefill time: then ``neither``. A simpler
option (native before local before shared) wins when it saves at least ``NEAR_BEST`` of the
best one's saving: the last tenth of a saving does not pay for a component to run.

An input the user did not give took its default. Each such input among :data:`CANDIDATES` is
tried at the ends of its plausible range; those that change the answer are reported, with the
answer they would give, so the user knows which figure to look up.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from kvstack.bench.plan.model import Hardware, PlanModelShape, WorkloadShape
from kvstack.bench.plan.options import Evaluation, evaluate_options

__all__ = ["CANDIDATES", "Decisive", "Plan", "make_plan", "recommend"]

MIN_SAVING = 0.05
NEAR_BEST = 0.9
ORDER = ("native", "local", "shared")

Inputs = tuple[PlanModelShape, Hardware, WorkloadShape]
# (section, field) -> the plausible low and high ends, from the assumed value
CANDIDATES: dict[tuple[str, str], Callable[[Any], tuple[Any, Any]]] = {
    ("workload", "hbm_kv_usage"): lambda v: (0.1, 0.99),
    ("workload", "other_traffic_tokens_per_s"): lambda v: (0.0, 20000.0),
    ("workload", "request_rate"): lambda v: (v / 10, v * 10),
    ("workload", "reuse_fraction"): lambda v: (0.1, 0.95),
    ("workload", "prefix_groups"): lambda v: (max(1, v // 10), v * 10),
    ("workload", "output_tokens"): lambda v: (max(1, v // 4), v * 4),
    ("workload", "routing"): lambda v: ("cache-aware", "random"),
    ("workload", "preemptions_per_hour"): lambda v: (0.0, 1000.0),
    ("hardware", "num_engines"): lambda v: (1, 8),
    ("hardware", "dram_gib"): lambda v: (16.0, 512.0),
    ("hardware", "prefill_tokens_per_s"): lambda v: (v / 2, v * 2),
    ("hardware", "load_wait_s"): lambda v: (0.002, 0.05),
}


@dataclass(frozen=True, slots=True)
class Decisive:
    """A missing input that changes the answer within its plausible range."""

    section: str
    name: str
    assumed: Any
    alternatives: tuple[tuple[Any, str], ...]  # (value, the recommendation it gives)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True, slots=True)
class Plan:
    evaluation: Evaluation
    recommendation: str  # an option name
    reason: str
    break_even_hbm_usage: float | None  # offload pays above it; None: not below 99.9%
    decisive: tuple[Decisive, ...]


def recommend(evaluation: Evaluation) -> tuple[str, str]:
    """(option name, why)."""
    baseline = evaluation.baseline_prefill_s_per_hour
    usable = [o for o in evaluation.options.values() if o.available and o.name != "neither"]
    best = max(usable, key=lambda o: o.seconds_saved_per_hour, default=None)
    if best is None or baseline <= 0 or best.seconds_saved_per_hour < MIN_SAVING * baseline:
        share = 0.0 if best is None or baseline <= 0 else best.seconds_saved_per_hour / baseline
        return "neither", (
            f"no offload option saves {MIN_SAVING:.0%} of prefill time (the best: {share:.1%}): "
            + _why_none(evaluation)
        )
    for name in ORDER:
        option = evaluation.options[name]
        if option.available and option.seconds_saved_per_hour >= NEAR_BEST * (
            best.seconds_saved_per_hour
        ):
            share = option.seconds_saved_per_hour / baseline
            return name, f"it saves {share:.0%} of prefill time ({_why(name, best.name)})"
    raise AssertionError("the best option is one of ORDER")


def _why_none(evaluation: Evaluation) -> str:
    reused = evaluation.reused_tokens
    if reused <= 0:
        return "no prompt shares a prefix with another, so there is nothing to load"
    paying = {n: t for n, t in evaluation.break_even.items() if t is not None
              and evaluation.tiers[n].capacity_tokens > 0}  # fmt: skip
    if not paying:
        return "no tier loads faster than the GPU recomputes"
    tier, shortest = min(paying.items(), key=lambda item: item[1])
    if reused < shortest:
        return (
            f"the reused prefix ({reused:,.0f} tokens) is shorter than the shortest load that "
            f"pays ({shortest:,.0f} tokens, from {tier})"
        )
    return f"vLLM's prefix cache already serves {evaluation.hbm_hit:.0%} of reused prefixes"


def _why(chosen: str, best: str) -> str:
    if chosen == best:
        return "the most of any option"
    return f"within {1 - NEAR_BEST:.0%} of {best}'s saving, with less to run"


def _answer(inputs: Inputs) -> str:
    return recommend(evaluate_options(*inputs))[0]


def _with(inputs: Inputs, section: str, name: str, value: Any) -> Inputs:
    model, hw, wl = inputs
    if section == "hardware":
        return model, hw.model_copy(update={name: value}), wl
    update: dict[str, Any] = {name: value}
    if name == "request_rate":
        update["requests_per_hour"] = None  # the rate is varied as requests per second
    return model, hw, wl.model_copy(update=update)


def break_even_hbm_usage(inputs: Inputs) -> float | None:
    """The smallest share of the HBM KV cache held by running requests above which an offload
    option is recommended: 0.0 when it already is on an idle engine."""
    if _answer(_with(inputs, "workload", "hbm_kv_usage", 0.0)) != "neither":
        return 0.0
    if _answer(_with(inputs, "workload", "hbm_kv_usage", 0.999)) == "neither":
        return None
    low, high = 0.0, 0.999
    for _ in range(30):
        mid = (low + high) / 2
        if _answer(_with(inputs, "workload", "hbm_kv_usage", mid)) == "neither":
            low = mid
        else:
            high = mid
    return high


def decisive_inputs(inputs: Inputs, given: Collection[str], answer: str) -> list[Decisive]:
    found = []
    for (section, name), ends in CANDIDATES.items():
        if f"{section}.{name}" in given or name in given:
            continue
        section_model = {"hardware": inputs[1], "workload": inputs[2]}[section]
        assumed = getattr(section_model, name)
        if name == "request_rate":
            assumed = inputs[2].rate_per_s
        others = []
        for value in ends(assumed):
            other = _answer(_with(inputs, section, name, value))
            if other != answer:
                others.append((value, other))
        if others:
            found.append(Decisive(section, name, assumed, tuple(others)))
    return found


def make_plan(
    model: PlanModelShape, hw: Hardware, wl: WorkloadShape, given: Collection[str] = ()
) -> Plan:
    """The plan for these inputs; ``given``: the inputs the user set (``section.field``)."""
    evaluation = evaluate_options(model, hw, wl)
    name, reason = recommend(evaluation)
    inputs = (model, hw, wl)
    return Plan(
        evaluation=evaluation,
        recommendation=name,
        reason=reason,
        break_even_hbm_usage=break_even_hbm_usage(inputs),
        decisive=tuple(decisive_inputs(inputs, given, name)),
    )
