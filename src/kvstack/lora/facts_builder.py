"""Building :class:`~kvstack.lora.facts.AdapterFacts` from the registry view (the resolver),
an engine's request stats, its residency entry and the scheduled warmups."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvstack.lora.facts import AdapterFacts

if TYPE_CHECKING:
    from kvstack.lora.adapters import AdapterVersion, Release
    from kvstack.lora.residency import Entry
    from kvstack.lora.resolver import Resolver
    from kvstack.lora.stats import StatsTable
    from kvstack.lora.warmup import WarmupSchedule

__all__ = ["FactsBuilder"]


class FactsBuilder:
    """Builds :class:`AdapterFacts` from the registry view, an engine's stats and its entry."""

    def __init__(self, resolver: Resolver, warmups: WarmupSchedule, window_s: float) -> None:
        self.resolver = resolver
        self.warmups = warmups
        self.window_s = window_s

    def of(
        self,
        a: AdapterVersion,
        entry: Entry | None,
        stats: StatsTable | None,
        now: float,
        home_rank: int = 0,
    ) -> AdapterFacts:
        """Facts about ``a`` on one engine (``entry``/``stats``/``home_rank``), or anywhere.

        ``qps_30m`` is the rate this version can expect: the adapter's rate over all its
        versions on the engine times this version's share of its traffic (the canary percent,
        the rest for the stable version), and 0 for a version no request is routed to any more.
        A version's own history would rank a just-published version of a popular adapter as
        unknown and a superseded one as popular; both would then hold the wrong slots.
        """
        seen = stats.peek(a.engine_name) if stats is not None else None
        release = self.resolver.release(a.adapter_id)
        current = self.resolver.version(a.adapter_id, a.version) or a
        canary = release is not None and release.canary_version == a.version
        is_current = self.resolver.is_current(a.adapter_id, a.version)
        qps = 0.0
        if stats is not None and is_current:
            qps = stats.adapter_rate(a.adapter_id, now, self.window_s) * _share(release, a.version)
        facts = AdapterFacts(
            adapter_id=a.adapter_id,
            version=a.version,
            status=current.status.value,
            canary_percent=release.canary_percent if canary and release else 0.0,
            tenant_id=a.tenant_id,
            tenant_priority=a.priority_tier,
            rank=a.rank,
            size_bytes=a.size_bytes,
            tier=entry.tier.value if entry else "cold",
            in_flight=entry.in_flight if entry else 0,
            qps_30m=qps,
            no_request_for_minutes=seen.idle_minutes(now) if seen else float("inf"),
            error_rate_after_load=seen.error_rate() if seen else 0.0,
            scheduled_warmup=False,
            is_current=is_current,
            home_rank=home_rank,
        )
        if self.warmups and self.warmups.active(facts.as_fields(), now):
            facts = replace(facts, scheduled_warmup=True)
        return facts


def _share(release: Release | None, version: str) -> float:
    """The fraction of an adapter's requests that go to ``version`` (a current one)."""
    if release is None or release.canary_version is None or release.stable_version is None:
        return 1.0
    canary = min(max(release.canary_percent / 100.0, 0.0), 1.0)
    return canary if version == release.canary_version else 1.0 - canary
