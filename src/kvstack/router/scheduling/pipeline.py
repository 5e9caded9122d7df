"""The scheduling pipeline: eligible backends → filters → weighted scorers → picker → decision.

The pipeline is synchronous and reads a snapshot of the pool, so a caller may run it at any
moment (at arrival, or at dispatch for late binding). It takes the candidates' live states,
shows the plugins read-only views of them, and hands back the chosen one's state
(``RoutingDecision.backend``): the handle the proxy takes load leases on and records failures
against. It explains every decision: the reason is
the scorer whose weighted score separated the chosen backend from the runner-up, or the picker's
tie-break when none did (``round_robin``, ``random``), or ``only_candidate``.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kvstack.errors import ConfigError, NoBackendError
from kvstack.router.fleet.backends import BackendState, BackendView
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.config import PipelineConfig, PluginSpec
from kvstack.router.scheduling.plugins import FILTERS, PICKERS, SCORERS
from kvstack.router.scheduling.plugins.base import (
    Candidate,
    Filter,
    Picker,
    Plugin,
    PluginContext,
    Scorer,
    ScoreResult,
)
from kvstack.router.telemetry import PANIC

__all__ = ["Pipeline", "RoutingDecision", "build_plugin", "eligible_backends", "preset"]

_EPS = 1e-9
P = TypeVar("P", bound=Plugin)


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    backend: BackendState  # the chosen backend's live state
    reason: str
    score: float
    num_candidates: int
    notes: tuple[str, ...] = ()

    def header(self) -> str:
        """The ``x-kvstack-decision`` header value."""
        parts = [f"reason={self.reason}", f"candidates={self.num_candidates}"]
        parts.append(f"score={self.score:.3f}")
        parts.extend(self.notes)
        return ";".join(parts)


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


class Pipeline:
    def __init__(
        self, filters: Sequence[Filter], scorers: Sequence[WeightedScorer], picker: Picker
    ):
        self.filters = list(filters)
        self.scorers = list(scorers)
        self.picker = picker

    @classmethod
    def from_config(cls, config: PipelineConfig, context: PluginContext) -> Pipeline:
        filters = [build_plugin(FILTERS.get(s.name), s, context) for s in config.filters]
        scorers = [
            WeightedScorer(build_plugin(SCORERS.get(s.name), s, context), s.weight)
            for s in config.scorers
        ]
        picker = build_plugin(PICKERS.get(config.picker.name), config.picker, context)
        return cls(filters, scorers, picker)

    def plugins(self) -> list[Plugin]:
        return [*self.filters, *(w.scorer for w in self.scorers), self.picker]

    def decide(
        self, request: RoutingRequest, candidates: Sequence[BackendState]
    ) -> RoutingDecision:
        """Choose one of ``candidates`` (eligible backends, see :func:`eligible_backends`)."""
        backends = self._filter(request, candidates)
        if len(backends) == 1:
            return RoutingDecision(_state_of(backends[0], candidates), "only_candidate", 0.0, 1)
        results = [(w, w.scorer.score(request, backends)) for w in self.scorers]
        ranked = _ranked(backends, results)
        chosen = self.picker.pick(request, ranked)
        reason, tie_note = self._reason(chosen, ranked, results)
        notes = [n for w, r in results if (n := _note(w.scorer.name, r, chosen.backend.id))]
        if tie_note:
            notes.append(tie_note)
        state = _state_of(chosen.backend, candidates)
        return RoutingDecision(state, reason, chosen.score, len(backends), tuple(notes))

    def _filter(
        self, request: RoutingRequest, candidates: Sequence[BackendView]
    ) -> list[BackendView]:
        backends = list(candidates)
        for f in self.filters:
            backends = f.filter(request, backends)
        if not backends:
            names = ", ".join(f.name for f in self.filters)
            raise NoBackendError(f"filters ({names}) left no backend for model {request.target!r}")
        return backends

    def _reason(
        self,
        chosen: Candidate,
        ranked: Sequence[Candidate],
        results: Sequence[tuple[WeightedScorer, ScoreResult]],
    ) -> tuple[str, str]:
        """(reason, tie note): the scorer that beat the best lower-scored candidate by the
        widest weighted margin; the picker's tie-break when nothing scored lower."""
        if chosen.score < ranked[0].score - _EPS:  # a randomising picker took a lower one
            return self.picker.tie_reason, ""
        num_tied = sum(1 for c in ranked if c.score >= chosen.score - _EPS)
        tie_note = f"tie={self.picker.tie_reason}/{num_tied}" if num_tied > 1 else ""
        runner_up = next((c for c in ranked if c.score < chosen.score - _EPS), None)
        if runner_up is None:
            return self.picker.tie_reason, ""
        best_name, best_margin = self.picker.tie_reason, _EPS
        for w, result in results:
            mine = result.scores.get(chosen.backend.id, 0.0)
            theirs = result.scores.get(runner_up.backend.id, 0.0)
            margin = w.weight * (mine - theirs)
            if margin > best_margin:
                best_name, best_margin = w.scorer.name, margin
        return best_name, tie_note


def _state_of(view: BackendView, candidates: Sequence[BackendState]) -> BackendState:
    """The live state behind a view the plugins chose (filters return the objects they got)."""
    for state in candidates:
        if state is view:
            return state
    for state in candidates:
        if state.id == view.id:
            return state
    raise ValueError(f"backend {view.id!r} is not among the candidates")


def _ranked(
    backends: Sequence[BackendView], results: Sequence[tuple[WeightedScorer, ScoreResult]]
) -> list[Candidate]:
    """Candidates by their weighted total score, best first."""
    totals = {b.id: 0.0 for b in backends}
    for w, result in results:
        for backend_id, value in result.scores.items():
            if backend_id in totals:
                totals[backend_id] += w.weight * value
    return sorted((Candidate(b, totals[b.id]) for b in backends), key=lambda c: -c.score)


def _note(name: str, result: ScoreResult, chosen: str) -> str:
    detail = result.details.get(chosen) if result.details else None
    text = detail or result.note
    return f"{name}={text}" if text else ""


def eligible_backends(
    states: Sequence[BackendState], target: str, exclude: Collection[str] = ()
) -> list[BackendState]:
    """Backends serving ``target`` that are reachable and not in ``exclude``, the ejected ones
    left out unless every candidate is ejected ("panic": passive ejection must not turn a
    fleet that answers health checks into a 503); NoBackendError says why there is none."""
    now_s = time.monotonic()
    serving = [s for s in states if target in s.models]
    reachable = [s for s in serving if s.id not in exclude and s.reachable]
    eligible = [s for s in reachable if not s.ejection.is_ejected(now_s)]
    if eligible:
        return eligible
    if reachable:
        PANIC.inc()
        return list(reachable)
    if not states:
        raise NoBackendError("no backends are configured or discovered")
    if not serving:
        raise NoBackendError(f"no backend serves model {target!r}")
    if all(s.id in exclude for s in serving):
        raise NoBackendError(f"every backend serving {target!r} failed this request")
    raise NoBackendError(f"every backend serving {target!r} is failing its health checks")


def preset(policy: str) -> PipelineConfig:
    """The pipeline behind each ``policy`` name."""
    load = PluginSpec(name="least_load")
    lora = PluginSpec(name="lora_affinity", weight=0.25)
    presets = {
        # The predicted-TTFT cost model; LoRA affinity breaks near-ties towards active adapters.
        "ttft": PipelineConfig(scorers=[PluginSpec(name="ttft"), lora]),
        # llm-d's default weighting: prefix 3, load 2.
        "prefix": PipelineConfig(
            scorers=[
                PluginSpec(name="prefix", weight=3.0),
                PluginSpec(name="least_load", weight=2.0),
            ]
        ),
        "round_robin": PipelineConfig(),
        "random": PipelineConfig(picker=PluginSpec(name="random")),
        "least_load": PipelineConfig(scorers=[load]),
        # Weight 2 > the load scorer's maximum of 1: the pinned backend wins unless it yields.
        "session": PipelineConfig(scorers=[PluginSpec(name="session_affinity", weight=2.0), load]),
    }
    return presets[policy]


def build_plugin(cls: type[P], spec: PluginSpec, context: PluginContext) -> P:
    """``cls(context, **spec.args)``; bad arguments are a ConfigError naming the plugin."""
    try:
        return cls(context, **spec.args)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"plugin {spec.name!r} rejects args {spec.args}: {exc}") from None
