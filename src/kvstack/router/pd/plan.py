"""What the prefill/decode step plans and reports: backend roles, the prefill's model, the
outcome.

A leaf, so that the request's state can hold the outcome (the cost model does not learn from a
TTFT whose prompt was prefilled elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["DECODE_ROLES", "PREFILL_ROLES", "PrefillModel", "PrefillOutcome"]

DECODE_ROLES = frozenset({"decode", "both"})  # backends that answer a PD model's requests
PREFILL_ROLES = frozenset({"prefill", "both"})


class PrefillModel(NamedTuple):
    """The ``model`` a remote prefill sends, or why it must not run (``skip``, an outcome)."""

    model: str
    skip: str = ""


@dataclass(frozen=True, slots=True)
class PrefillOutcome:
    outcome: str  # remote | short_suffix | no_prefill_backend | adapter_not_hot | failed:<kind>
    backend: str = ""
    seconds: float = 0.0
    uncached_tokens: int = 0

    @property
    def is_remote(self) -> bool:
        """The prompt's KV was computed on another backend (``backend``)."""
        return self.outcome == "remote"

    def note(self) -> str:
        if self.is_remote:
            return f"pd=remote:{self.backend}({self.seconds * 1000:.0f}ms)"
        return f"pd={self.outcome}(uncached={self.uncached_tokens})"
