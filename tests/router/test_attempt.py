"""The ``x-kvstack-decision`` header: docs/router.md's table names exactly the fields the
router emits, found by running every registered scorer and picker, a retry and each
prefill/decode outcome through the real header builders."""

from __future__ import annotations

import random
import re
from pathlib import Path

from kvstack.router.attempt import Attempt
from kvstack.router.config import PipelineConfig
from kvstack.router.pd.plan import PrefillOutcome
from kvstack.router.scheduling.pipeline import Pipeline, RoutingDecision
from kvstack.router.scheduling.plugins import PICKERS, SCORERS, PluginContext
from tests.router.scheduling.test_pipeline import request, state

DOC = Path(__file__).resolve().parents[2] / "docs" / "router.md"
PD_OUTCOMES = ["remote", "short_suffix", "no_prefill_backend", "adapter_not_hot", "failed:timeout"]


def _documented() -> dict[str, str]:
    """field -> its table row, from the table after the ``decision-fields`` marker."""
    table = DOC.read_text().split("<!-- decision-fields", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \|(.*)$", table, flags=re.MULTILINE)
    return dict(rows)


def _decisions() -> list[RoutingDecision]:
    """One decision per scorer alone (each with a tie), one per picker, and all scorers."""
    specs = [[{"name": name}] for name in SCORERS.names()]
    specs.append([{"name": name} for name in SCORERS.names()])
    pickers = [{"name": name} for name in PICKERS.names()]
    configs = [{"scorers": s} for s in specs] + [
        {"scorers": [{"name": "least_load"}], "picker": p} for p in pickers
    ]
    backends = [state("a", in_flight=2), state("b"), state("c")]  # b and c tie on load
    decisions = []
    for config in configs:
        context = PluginContext(rng=random.Random(1))
        pipeline = Pipeline.from_config(PipelineConfig.model_validate(config), context)
        decisions.append(pipeline.decide(request(session="s1"), backends))
    alone = Pipeline.from_config(PipelineConfig(), PluginContext())
    decisions.append(alone.decide(request(), [state("only")]))
    return decisions


def _fields(header: str) -> set[str]:
    return {part.split("=", 1)[0] for part in header.split(";")}


def test_the_decision_table_names_exactly_the_fields_the_router_emits() -> None:
    emitted: set[str] = set()
    for decision in _decisions():
        notes = [PrefillOutcome(o, "b", 0.01, 100).note() for o in PD_OUTCOMES]
        for number in (1, 2):
            attempt = Attempt(number, decision, b"", {}, notes=notes)
            emitted |= _fields(attempt.decision_header())
            emitted |= _fields(attempt.public_decision_header())
    assert {"tie", "pd", "attempt", "ttft", "prefix"} <= emitted  # every stage was exercised
    assert set(_documented()) == emitted


def test_the_reason_row_names_every_scorer_and_tie_break() -> None:
    reasons = {decision.reason for decision in _decisions()}
    names = {*SCORERS.names(), *(PICKERS.get(n).tie_reason for n in PICKERS.names())}
    row = _documented()["reason"]
    assert "only_candidate" in reasons
    assert all(f"`{name}`" in row for name in names | reasons), row
