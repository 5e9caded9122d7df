"""Scheduled warmups: adapters selected by a rule are prewarmed at startup or daily before a
given UTC time, and score a bonus in the weighted policy while their window lasts."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from kvstack.lora.config import ScheduledWarmup
from kvstack.lora.expr import Rule, compile_rule
from kvstack.lora.facts import FACT_TYPES

__all__ = ["WarmupSchedule"]

_DAY_S = 86_400.0


class WarmupSchedule:
    def __init__(self, warmups: Sequence[ScheduledWarmup], started_at: float) -> None:
        self.started_at = started_at
        self._items = [(w, compile_rule(w.select, FACT_TYPES)) for w in warmups]
        self._fired: set[tuple[int, float]] = set()  # (warmup index, window start) done

    def __bool__(self) -> bool:
        return bool(self._items)

    def active(self, fields: Mapping[str, Any], now: float) -> bool:
        """Whether a warmup window covers an adapter with these facts at wall time ``now``."""
        return any(self._window(w, now) is not None and rule(fields) for w, rule in self._items)

    def due(self, now: float) -> list[Rule]:
        """Selectors of warmups whose window opened and that have not fired for it yet."""
        rules = []
        for i, (w, rule) in enumerate(self._items):
            start = self.started_at if w.at == "startup" else self._window(w, now)
            if start is not None and (i, start) not in self._fired:
                self._fired.add((i, start))
                rules.append(rule)
        return rules

    def _window(self, w: ScheduledWarmup, now: float) -> float | None:
        """Start of the window containing ``now``; 'startup' opens once, when the schedule does."""
        if w.at == "startup":
            hold_end = self.started_at + w.hold_minutes * 60
            return self.started_at if now < hold_end else None
        hours, minutes = (int(p) for p in w.at.split(":"))
        midnight = dt.datetime.fromtimestamp(now, dt.timezone.utc).replace(
            hour=0, minute=0, second=0, microsecond=0
        )
        for day in (-1, 0, 1):
            at = midnight.timestamp() + day * _DAY_S + hours * 3600 + minutes * 60
            start, end = at - w.lead_minutes * 60, at + w.hold_minutes * 60
            if start <= now < end:
                return start
        return None
