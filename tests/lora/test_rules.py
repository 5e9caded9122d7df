"""The rule language, eviction policies, load-time prediction, warmup windows, metric labels."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from kvstack.errors import ConfigError
from kvstack.lora.adapters import AdapterVersion, Release, Status
from kvstack.lora.config import AdapterCachePolicy, HotScoreWeights, LoRAConfig, ScheduledWarmup
from kvstack.lora.expr import compile_rule
from kvstack.lora.facts import FACT_TYPES, AdapterFacts
from kvstack.lora.facts_builder import FactsBuilder
from kvstack.lora.metrics import OTHER, LoRAMetrics
from kvstack.lora.policy import AdapterLRUPolicy, EvictionCandidate, WeightedLRUPolicy
from kvstack.lora.predict import LoadTimePredictor
from kvstack.lora.resolver import Resolver
from kvstack.lora.rules import CacheRules
from kvstack.lora.stats import StatsTable
from kvstack.lora.warmup import WarmupSchedule

FACTS = AdapterFacts(
    adapter_id="a",
    version="1",
    status="canary",
    canary_percent=5.0,
    tenant_id="acme",
    tenant_priority="gold",
    rank=16,
    size_bytes=1 << 20,
    tier="hot",
    in_flight=0,
    qps_30m=0.5,
    no_request_for_minutes=3.0,
    error_rate_after_load=0.0,
    scheduled_warmup=False,
    is_current=True,
    home_rank=0,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("status == 'canary' and canary_percent > 0", True),
        ("tenant_priority == 'platinum'", False),
        ("not (rank > 8) or qps_30m >= 0.5", True),
        ("tenant_priority in ('gold', 'platinum')", True),
        ("tenant_priority not in ['gold']", False),
        ("0 < no_request_for_minutes <= 5", True),
        ("error_rate_after_load > 0.02", False),
        ("rank == 16.0", True),
        ("canary_percent > -1", True),
    ],
)
def test_rules_evaluate(text: str, expected: bool) -> None:
    assert compile_rule(text, FACT_TYPES)(FACTS.as_fields()) is expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("__import__('os').system('id')", "Call is not allowed"),
        ("status.upper() == 'X'", "not allowed"),
        ("tenant_priority[0] == 'p'", "Subscript is not allowed"),
        ("(lambda: 1)()", "not allowed"),
        ("tier_name == 'gold'", "unknown field 'tier_name'"),
        ("rank == 'sixteen'", "cannot compare int with str"),
        ("rank + 1 > 2", "BinOp is not allowed"),
        ("status in status", "'in' needs a list or tuple"),
        ("status ==", "not valid"),
        ("[x for x in (1,)]", "not allowed"),
    ],
)
def test_unsafe_or_wrong_rules_are_refused(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        compile_rule(text, FACT_TYPES)


def test_config_rejects_bad_rules_when_loading() -> None:
    with pytest.raises(ValueError, match="unknown field"):
        AdapterCachePolicy(never_evict_when=["tenant == 'x'"])
    with pytest.raises(ValueError, match=r"allowed 0\.0-1\.0"):
        LoRAConfig(priority_weights={"gold": 2.0})


def test_pins_hold_for_current_versions_only() -> None:
    rules = CacheRules(AdapterCachePolicy())
    platinum = dataclasses.replace(FACTS, status="active", tenant_priority="platinum")
    assert rules.pinned(platinum) and rules.pinned(FACTS)  # platinum; canary with traffic
    assert not rules.pinned(dataclasses.replace(platinum, is_current=False))
    assert rules.should_demote(dataclasses.replace(FACTS, no_request_for_minutes=61)) == (
        "no_request_for_minutes > 60"
    )


def _candidate(name: str, qps: float, last: float, tier: str = "standard") -> EvictionCandidate:
    facts = dataclasses.replace(FACTS, adapter_id=name, qps_30m=qps, tenant_priority=tier)
    return EvictionCandidate(name, facts, last, reload_s=1.0)


def test_weighted_keeps_the_popular_where_lru_keeps_the_recent() -> None:
    popular = _candidate("popular", qps=2.0, last=100.0)
    one_off = _candidate("one-off", qps=0.01, last=200.0)  # requested once, just now
    assert AdapterLRUPolicy().victim([popular, one_off]) is popular
    weighted = WeightedLRUPolicy(HotScoreWeights(), {"gold": 0.6, "standard": 0.2})
    assert weighted.victim([popular, one_off]) is one_off
    gold_idle = _candidate("gold", qps=0.01, last=50.0, tier="gold")
    assert weighted.victim([gold_idle, one_off]) is one_off  # same rate: the tier decides
    assert weighted.victim([]) is None


def test_weighted_evicts_a_superseded_version_first() -> None:
    weighted = WeightedLRUPolicy(HotScoreWeights(), {"platinum": 1.0, "standard": 0.1})
    old = _candidate("old", qps=5.0, last=300.0, tier="platinum")
    old = dataclasses.replace(old, facts=dataclasses.replace(old.facts, is_current=False))
    idle = _candidate("idle", qps=0.001, last=1.0)
    assert weighted.victim([idle, old]) is old  # no request will come for it, whatever its past


def _versions(release: Release) -> FactsBuilder:
    one = AdapterVersion(adapter_id="a", version="1", base_model="base", rank=8, alpha=16.0,
                         artifact_uri="", sha256="", size_bytes=1 << 20, tenant_id="acme",
                         priority_tier="gold", target_modules=("q_proj",),
                         status=Status.ACTIVE)  # fmt: skip
    versions = {("a", v): dataclasses.replace(one, version=v) for v in "12"}
    resolver = Resolver(None, LoRAConfig())
    resolver.load_snapshot(({"a": release}, versions))
    return FactsBuilder(resolver, WarmupSchedule([], 0.0), window_s=600.0)


def test_a_new_version_inherits_its_adapters_popularity_and_the_old_one_loses_it() -> None:
    stats = StatsTable(600.0)
    for t in range(10):
        stats.get("a@1").on_request(float(t), 600.0)
    rate = stats.get("a@1").rate(10.0, 600.0)
    promoted = _versions(Release("a", stable_version="2"))
    v1, v2 = (promoted.resolver.version("a", v) for v in ("1", "2"))
    assert v1 is not None and v2 is not None
    assert promoted.of(v2, None, stats, 10.0).qps_30m == pytest.approx(rate)
    assert promoted.of(v1, None, stats, 10.0).qps_30m == 0.0  # superseded: nothing routed to it
    canary = _versions(Release("a", stable_version="1", canary_version="2", canary_percent=25))
    assert canary.of(v2, None, stats, 10.0).qps_30m == pytest.approx(0.25 * rate)
    assert canary.of(v1, None, stats, 10.0).qps_30m == pytest.approx(0.75 * rate)
    stats.get("a@2").on_request(10.0, 600.0)  # both versions' requests count
    total = rate + stats.get("a@2").rate(10.0, 600.0)
    assert promoted.of(v2, None, stats, 10.0).qps_30m == pytest.approx(total)


def test_pruned_stats_leave_their_adapters_rate() -> None:
    stats = StatsTable(600.0, max_entries=10)
    for i in range(10):
        stats.get(f"idle-{i}@1")
    stats.get("b@1").on_request(0.0, 600.0)  # a new entry prunes the emptiest tenth
    assert stats.adapter_rate("b", 0.0, 600.0) > 0.0
    assert sum(stats.adapter_rate(f"idle-{i}", 0.0, 600.0) for i in range(10)) == 0.0
    assert sum(stats.peek(f"idle-{i}@1") is None for i in range(10)) == 1


def test_prediction_moves_from_prior_to_observed() -> None:
    p = LoadTimePredictor({"warm": 0.5, "cold": 3.0}, quantile=0.9, min_samples=3)
    assert p.predict("e", "cold") == 3.0 and p.predict("e", "hot") == 0.0
    for seconds in (0.10, 0.11, 0.12, 0.13, 0.9):
        p.observe("e", "cold", seconds)
    assert 0.13 <= p.predict("e", "cold") <= 0.9 * 1.15  # p90 bucket, 15 % resolution
    assert p.predict("other-engine", "cold") == p.predict("e", "cold")  # across engines


def test_warmup_windows() -> None:
    at = dt.datetime(2030, 1, 1, 9, 0, tzinfo=dt.timezone.utc).timestamp()
    schedule = WarmupSchedule(
        [
            ScheduledWarmup(
                select="tenant_id == 'acme'", at="09:00", lead_minutes=10, hold_minutes=30
            ),
            ScheduledWarmup(select="tenant_priority == 'gold'", at="startup", hold_minutes=1),
        ],
        started_at=at - 3600,
    )
    fields = FACTS.as_fields()
    assert len(schedule.due(at - 3600)) == 1  # the startup warmup, once
    assert schedule.due(at - 3000) == []
    assert not schedule.active({**fields, "tenant_priority": "x"}, at - 11 * 60)
    assert schedule.active(fields, at - 9 * 60) and len(schedule.due(at - 9 * 60)) == 1
    assert schedule.due(at - 8 * 60) == []  # fired once per window
    assert not schedule.active({**fields, "tenant_priority": "x"}, at + 31 * 60)


def test_metric_labels_stay_bounded() -> None:
    metrics = LoRAMetrics(top_k=3, recompute_every=50)
    for i in range(2000):
        adapter = f"ad{i % 10}" if i % 2 else "hot-one"
        metrics.request(adapter, "hot", protected=False)
    assert metrics.label("hot-one") == "hot-one"
    named = {a for a in (f"ad{i}" for i in range(10)) if metrics.label(a) != OTHER}
    assert len(named) <= 2
    assert metrics.label("canary-x", protected=True) == "canary-x"
    from prometheus_client import REGISTRY

    series = {
        s.labels["adapter"]
        for f in REGISTRY.collect()
        if f.name == "kvstack_lora_requests"
        for s in f.samples
    }
    ours = {"hot-one"} | {f"ad{i}" for i in range(10)}
    assert len(series & ours) <= 3  # the top K; the rest are counted under "other"
