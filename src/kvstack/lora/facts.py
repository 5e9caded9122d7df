"""The facts cache-policy rules and hot scores see about one adapter version on one engine.

:data:`FACT_TYPES` is the schema rules are checked against when the config loads; the manager
builds an :class:`AdapterFacts` per candidate (:mod:`kvstack.lora.facts_builder`) when it plans
an eviction or a demotion sweep. A leaf: the config section imports it to check its rules, so
it imports nothing of kvstack.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["FACT_TYPES", "RENAMED_FACTS", "AdapterFacts"]


@dataclass(frozen=True, slots=True)
class AdapterFacts:
    adapter_id: str
    version: str
    status: str  # active, canary, staged, deprecated, disabled
    canary_percent: float
    tenant_id: str
    tenant_priority: str  # platinum, gold, standard, ...
    rank: int
    size_bytes: int
    tier: str  # hot or warm: where it is on this engine now
    in_flight: int  # requests using it on this engine
    # Requests per second this version can expect here, decayed with the time constant
    # qps_window_s (default 1800 s, the 30 minutes of the name; see FactsBuilder.of).
    qps_30m: float
    no_request_for_minutes: float
    error_rate_after_load: float  # failed / all requests since it was last loaded here
    scheduled_warmup: bool  # a scheduled warmup window covers it now
    is_current: bool  # the stable or canary target of its adapter
    home_rank: int  # this engine's place in the adapter's rendezvous order (0: its home)

    def as_fields(self) -> Mapping[str, Any]:
        # A read-only view, not a copy: rules run for every eviction candidate.
        return _FieldsView(self)


class _FieldsView(Mapping[str, Any]):
    __slots__ = ("_facts",)

    def __init__(self, facts: AdapterFacts) -> None:
        self._facts = facts

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self._facts, key)
        except AttributeError:
            raise KeyError(key) from None

    def __iter__(self) -> Iterator[str]:
        return iter(AdapterFacts.__slots__)

    def __len__(self) -> int:
        return len(AdapterFacts.__slots__)


FACT_TYPES: dict[str, type] = {
    "adapter_id": str,
    "version": str,
    "status": str,
    "canary_percent": float,
    "tenant_id": str,
    "tenant_priority": str,
    "rank": int,
    "size_bytes": int,
    "tier": str,
    "in_flight": int,
    "qps_30m": float,
    "no_request_for_minutes": float,
    "error_rate_after_load": float,
    "scheduled_warmup": bool,
    "is_current": bool,
    "home_rank": int,
}

# Former fact names (in rules) and hot-score weight keys, accepted with a warning: old -> new.
# ``qps_10m`` was a rate decayed over 30 minutes, not 10.
RENAMED_FACTS: dict[str, str] = {"qps_10m": "qps_30m"}
