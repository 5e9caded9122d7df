"""The cache policy's rules, compiled once: which adapters are pinned, which are demoted."""

from __future__ import annotations

from kvstack.lora.config import AdapterCachePolicy
from kvstack.lora.expr import compile_rule
from kvstack.lora.facts import FACT_TYPES, AdapterFacts

__all__ = ["CacheRules"]


class CacheRules:
    def __init__(self, policy: AdapterCachePolicy) -> None:
        self.never_evict = [compile_rule(r, FACT_TYPES) for r in policy.never_evict_when]
        self.demote = [compile_rule(r, FACT_TYPES) for r in policy.demote_when]

    def pinned(self, facts: AdapterFacts) -> bool:
        """Pins hold for current versions only: a superseded or disabled version is retired
        even when its tenant is platinum."""
        if not facts.is_current:
            return False
        fields = facts.as_fields()
        return any(rule(fields) for rule in self.never_evict)

    def should_demote(self, facts: AdapterFacts) -> str | None:
        """The text of the first demotion rule that matches, or None."""
        fields = facts.as_fields()
        return next((rule.text for rule in self.demote if rule(fields)), None)
