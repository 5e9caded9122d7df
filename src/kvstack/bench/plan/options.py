"""The four answers ``kvstack plan`` weighs, each with what it saves per hour.

- ``neither``: vLLM's own prefix cache in HBM, nothing else (the baseline);
- ``native``: vLLM's native CPU offload (``OffloadingConnector``): host memory, this engine
  only, every computed block stored (generated tokens too); CUDA or XPU only;
- ``local``: kvstack with local tiers (``cpu://``, ``file://``): this engine's host memory and
  disk, full prompt chunks stored;
- ``shared``: kvstack with a shared tier too (``redis://``, ``s3://``, ``peer://``): what one
  engine computed serves every engine.

Each tier is an LRU cache fed by its own stream (:mod:`kvstack.bench.plan.cache`): HBM and
native offload take every computed token, kvstack's tiers the unique prompt tokens; a shared
tier sees each prefix at the whole fleet's rate. A hit in a tier saves recomputing the reused
prefix and costs its load; a preempted request (vLLM recomputes it on resume) is recovered
from host memory by native offload in full, by kvstack for its prompt's chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstack.bench.plan.cache import PrefixStream, hit_probability
from kvstack.bench.plan.model import (
    Hardware,
    PlanModelShape,
    TierFigures,
    WorkloadShape,
    break_even_tokens,
    prefill_s,
    tier_figures,
)

__all__ = ["LABELS", "Evaluation", "OptionFigures", "evaluate_options"]

LABELS = {
    "neither": "neither (vLLM's prefix cache alone)",
    "native": "native vLLM CPU offload",
    "local": "kvstack with local tiers",
    "shared": "kvstack with shared tiers",
}
HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class OptionFigures:
    name: str
    available: bool
    why_not: str = ""
    hits: dict[str, float] = field(default_factory=dict)  # tier -> share of requests it serves
    tokens_saved_per_hour: float = 0.0  # prefill tokens not computed, beyond HBM hits
    seconds_saved_per_hour: float = 0.0  # prefill seconds saved against `neither`, loads paid
    preempted_tokens_recovered_per_hour: float = 0.0

    @property
    def label(self) -> str:
        return LABELS[self.name]


@dataclass(frozen=True, slots=True)
class Evaluation:
    kv_bytes_per_token: float
    tiers: dict[str, TierFigures]
    free_hbm_tokens: float  # per engine, for cached prefixes
    per_engine_working_set: float
    break_even: dict[str, float | None]  # tier -> shortest prefix a load pays for
    reused_tokens: float  # of each prompt
    hbm_hit: float
    hbm_tokens_saved_per_hour: float  # what vLLM's own prefix cache saves
    baseline_prefill_s_per_hour: float
    options: dict[str, OptionFigures]


@dataclass(frozen=True, slots=True)
class _Streams:
    hbm: PrefixStream  # every computed token enters vLLM's prefix cache
    kvstack: PrefixStream  # kvstack stores the unique full prompt chunks
    fleet: PrefixStream  # a shared tier: each prefix at the fleet's rate


def _streams(wl: WorkloadShape, hw: Hardware) -> _Streams:
    rate, reused = wl.rate_per_s, wl.reused_tokens
    per_engine = rate / hw.num_engines
    if wl.routing == "cache-aware":
        groups, group_rate = wl.groups / hw.num_engines, rate / wl.groups
    else:
        groups, group_rate = wl.groups, rate / wl.groups / hw.num_engines
    unique = wl.prompt_tokens - reused
    other = wl.other_traffic_tokens_per_s
    return _Streams(
        PrefixStream(per_engine * (unique + wl.output_tokens) + other, groups, reused, group_rate),
        PrefixStream(per_engine * unique + other, groups, reused, group_rate),
        PrefixStream(rate * unique + other * hw.num_engines, wl.groups, reused, rate / wl.groups),
    )


class _Costs:
    """Per-hour savings of loading ``reused`` tokens from a tier instead of computing them."""

    def __init__(self, model: PlanModelShape, hw: Hardware, wl: WorkloadShape) -> None:
        self.b, self.hw, self.wl = model.kv_bytes_per_token, hw, wl
        self.requests_per_hour = wl.rate_per_s * HOUR_S

    def saving_s(self, tier: TierFigures, num_tokens: float) -> float:
        load = tier.load_s(num_tokens, self.b, self.hw.fixed_load_s)
        return prefill_s(self.hw, 0, num_tokens) - load

    def hits(self, shares: dict[str, float], tiers: dict[str, TierFigures]) -> tuple[float, float]:
        """(tokens, seconds) saved per hour by these tiers' hits."""
        reused = self.wl.reused_tokens
        tokens = sum(shares.values()) * self.requests_per_hour * reused
        seconds = sum(
            share * self.requests_per_hour * self.saving_s(tiers[name], reused)
            for name, share in shares.items()
        )
        return tokens, seconds

    def preempted(self, tier: TierFigures, recovered_tokens: float) -> tuple[float, float]:
        n = self.wl.preemptions_per_hour
        return n * recovered_tokens, n * self.saving_s(tier, recovered_tokens)


def _shares(levels: list[tuple[str, float]], below: float) -> dict[str, float]:
    """Each level's extra share of hits over the levels above it (inclusive caches)."""
    shares, best = {}, below
    for name, hit in levels:
        shares[name] = max(0.0, hit - best)
        best = max(best, hit)
    return shares


def _option(
    name: str,
    shares: dict[str, float],
    preempt: tuple[TierFigures, float] | None,
    tiers: dict[str, TierFigures],
    costs: _Costs,
) -> OptionFigures:
    tokens, seconds = costs.hits(shares, tiers)
    recovered = 0.0
    if preempt is not None:
        recovered, preempt_s = costs.preempted(*preempt)
        tokens, seconds = tokens + recovered, seconds + preempt_s
    return OptionFigures(name, True, "", shares, tokens, seconds, recovered)


def evaluate_options(model: PlanModelShape, hw: Hardware, wl: WorkloadShape) -> Evaluation:
    tiers = tier_figures(model, hw)
    streams, costs = _streams(wl, hw), _Costs(model, hw, wl)
    free = tiers["hbm"].capacity_tokens * (1 - wl.hbm_kv_usage)
    hbm = hit_probability(free, streams.hbm)
    cpu, disk, remote = tiers["cpu"], tiers["disk"], tiers["remote"]
    lost = wl.prompt_tokens + wl.output_tokens / 2  # a preempted request's context, on average
    options = {"neither": OptionFigures("neither", True)}
    local = [(n, hit_probability(t.capacity_tokens, streams.kvstack)) for n, t in
             (("cpu", cpu), ("disk", disk)) if t.capacity_tokens > 0]  # fmt: skip
    fastest = tiers[local[0][0]] if local else None
    if hw.accelerator != "gpu":
        options["native"] = OptionFigures("native", False, "vLLM's CPU build refuses it")
    elif cpu.capacity_tokens <= 0:
        options["native"] = OptionFigures("native", False, "no host memory (--dram-gib)")
    else:
        native = [("cpu", hit_probability(cpu.capacity_tokens, streams.hbm))]
        options["native"] = _option("native", _shares(native, hbm), (cpu, lost), tiers, costs)
    if fastest is None:
        options["local"] = OptionFigures("local", False, "no local tier (--dram-gib, --disk-gib)")
    else:
        pre = (fastest, float(wl.prompt_tokens))
        options["local"] = _option("local", _shares(local, hbm), pre, tiers, costs)
    if remote.capacity_tokens <= 0:
        options["shared"] = OptionFigures("shared", False, "no shared tier (--remote-gib)")
    else:
        levels = [*local, ("remote", hit_probability(remote.capacity_tokens, streams.fleet))]
        pre = (fastest or remote, float(wl.prompt_tokens))
        options["shared"] = _option("shared", _shares(levels, hbm), pre, tiers, costs)
    return Evaluation(
        kv_bytes_per_token=model.kv_bytes_per_token,
        tiers=tiers,
        free_hbm_tokens=free,
        per_engine_working_set=streams.hbm.num_prefixes * wl.reused_tokens,
        break_even={
            n: break_even_tokens(t, hw, model.kv_bytes_per_token, hw.fixed_load_s)
            for n, t in tiers.items()
            if n != "hbm"
        },
        reused_tokens=wl.reused_tokens,
        hbm_hit=hbm,
        hbm_tokens_saved_per_hour=hbm * costs.requests_per_hour * wl.reused_tokens,
        baseline_prefill_s_per_hour=_baseline_s(hw, wl, hbm, lost),
        options=options,
    )


def _break_even(
    model: PlanModelShape, hw: Hardware, tiers: dict[str, TierFigures]
) -> dict[str, float | None]:
    b = model.kv_bytes_per_token
    return {n: break_even_tokens(t, hw, b, hw.fixed_load_s) for n, t in tiers.items() if n != "hbm"}


def _baseline_s(hw: Hardware, wl: WorkloadShape, hbm_hit: float, lost_tokens: float) -> float:
    requests = wl.rate_per_s * HOUR_S
    hit = prefill_s(hw, wl.reused_tokens, wl.prompt_tokens)
    miss = prefill_s(hw, 0, wl.prompt_tokens)
    preempted = wl.preemptions_per_hour * prefill_s(hw, 0, lost_tokens)
    return requests * (hbm_hit * hit + (1 - hbm_hit) * miss) + preempted
