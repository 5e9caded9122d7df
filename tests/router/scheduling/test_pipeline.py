"""Filters, scorers, pickers and the pipeline over in-process backend states (no sockets)."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from kvstack.errors import ConfigError, NoBackendError
from kvstack.router.config import EjectionConfig, PipelineConfig, PluginSpec
from kvstack.router.fleet.backends import Backend, BackendState
from kvstack.router.fleet.engine_metrics import ScrapedMetrics
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.pipeline import Pipeline, eligible_backends, preset
from kvstack.router.scheduling.plugins import FILTERS, PICKERS, SCORERS, PluginContext
from kvstack.router.scheduling.plugins.base import Candidate
from kvstack.router.scheduling.plugins.pickers import MaxScorePicker
from kvstack.router.scheduling.plugins.session import rendezvous_rank


def state(
    name: str,
    in_flight: int = 0,
    waiting: float | None = None,
    kv: float | None = None,
    labels: dict[str, str] | None = None,
) -> BackendState:
    s = BackendState(
        Backend(name, f"http://{name}:1", labels=labels or {}, static_models=frozenset({"m"}))
    )
    for _ in range(in_flight):
        s.load.acquire(10)
    if waiting is not None or kv is not None:
        s.set_engine_metrics(
            ScrapedMetrics(time.monotonic(), running=0, waiting=waiting, kv_usage=kv)
        )
    return s


def request(session: str | None = None) -> RoutingRequest:
    return RoutingRequest(
        request_id="r",
        endpoint="completions",
        model="m",
        target="m",
        prompt="hello",
        session_id=session,
    )


def pipeline(policy: str | None = None, **config: object) -> Pipeline:
    spec = preset(policy) if policy else PipelineConfig.model_validate(config)
    return Pipeline.from_config(spec, PluginContext(rng=random.Random(1)))


@pytest.mark.parametrize("name", SCORERS.names())
def test_every_scorer_stays_in_unit_range(name: str) -> None:
    scorer = SCORERS.get(name)(PluginContext())
    backends = [state("a", 3, waiting=9, kv=0.95), state("b", 0), state("c", 1, waiting=0)]
    for session in (None, "s1", "s2"):
        result = scorer.score(request(session), backends)
        assert all(0.0 <= v <= 1.0 for v in result.scores.values())
        assert set(result.scores) <= {"a", "b", "c"}


@pytest.mark.parametrize("name", FILTERS.names())
def test_every_filter_returns_a_subset_in_order(name: str) -> None:
    f = FILTERS.get(name)(PluginContext())
    backends = [state("a", 3, waiting=9), state("b"), state("c", kv=0.99)]
    kept = f.filter(request(), backends)
    assert [b.id for b in kept] == [b.id for b in backends if b in kept]


@pytest.mark.parametrize("name", PICKERS.names())
def test_every_picker_picks_a_candidate(name: str) -> None:
    p = pipeline(picker={"name": name}, scorers=[{"name": "least_load"}])
    backends = [state("a", 2), state("b"), state("c", 1)]
    for _ in range(20):
        assert p.decide(request(), backends).backend in backends


def test_round_robin_rotates_and_says_so() -> None:
    p = pipeline("round_robin")
    backends = [state("a"), state("b"), state("c")]
    decisions = [p.decide(request(), backends) for _ in range(6)]
    assert [d.backend.id for d in decisions] == ["a", "b", "c", "a", "b", "c"]
    assert {d.reason for d in decisions} == {"round_robin"}


def test_max_score_ties_go_to_the_backend_chosen_least_recently() -> None:
    # The tie set shifts between picks (here b and c tie while a scores lower); a counter
    # modulo the number of ties would send the second pick to b again and leave c idle.
    picker = MaxScorePicker(PluginContext())
    a, b, c = state("a"), state("b"), state("c")
    every = [(a, 1.0), (b, 1.0), (c, 1.0)]
    rounds = [every, [(b, 1.0), (c, 1.0), (a, 0.5)], every, [(c, 2.0), (a, 1.0)], every[:2]]
    picks = [picker.pick(request(), [Candidate(s, v) for s, v in r]).backend.id for r in rounds]
    assert picks == ["a", "b", "c", "c", "a"]


def test_random_picks_every_backend() -> None:
    p = pipeline("random")
    backends = [state("a"), state("b"), state("c")]
    seen = Counter(p.decide(request(), backends).backend.id for _ in range(300))
    assert set(seen) == {"a", "b", "c"} and min(seen.values()) > 60


def test_least_load_counts_in_flight_and_foreign_engine_load() -> None:
    p = pipeline("least_load")
    a, b = state("a", in_flight=2), state("b", in_flight=0, waiting=5)  # b: 5 from elsewhere
    d = p.decide(request(), [a, b])
    assert d.backend.id == "a" and d.reason == "least_load"
    assert b.estimated_requests == 5 and a.estimated_requests == 2


def test_stale_metrics_are_ignored() -> None:
    b = state("b", waiting=50)
    b.stale_after_s = 0.0
    assert b.engine is None and b.estimated_requests == 0


def test_session_affinity_pins_by_rendezvous_and_yields() -> None:
    p = pipeline("session")
    backends = [state("a"), state("b"), state("c")]
    pinned = rendezvous_rank("user-1", backends)[0]
    d = p.decide(request("user-1"), backends)
    assert (
        d.backend is pinned
        and d.reason == "session_affinity"
        and "session_affinity=pinned" in d.notes
    )
    # Losing another backend does not move the session.
    survivors = [
        b for b in backends if b is pinned or b.id == rendezvous_rank("user-1", backends)[1].id
    ]
    assert p.decide(request("user-1"), survivors).backend is pinned
    pinned.set_engine_metrics(ScrapedMetrics(time.monotonic(), running=1, waiting=9))
    d = p.decide(request("user-1"), backends)
    assert d.backend is not pinned and "session_affinity=yield:waiting" in d.notes
    assert d.reason == "least_load"


def test_not_saturated_filter_keeps_all_when_all_are_saturated() -> None:
    f = FILTERS.get("not_saturated")(PluginContext())
    hot, cool = state("hot", kv=0.95), state("cool", kv=0.1)
    assert f.filter(request(), [hot, cool]) == [cool]
    assert f.filter(request(), [hot]) == [hot]


def test_label_filter_and_a_reason_when_filters_leave_nothing() -> None:
    p = pipeline(filters=[{"name": "labels", "args": {"match": {"zone": "a"}}}])
    backends = [state("x", labels={"zone": "a"}), state("y", labels={"zone": "b"})]
    assert p.decide(request(), backends).backend.id == "x"
    with pytest.raises(NoBackendError, match="labels"):
        p.decide(request(), backends[1:])


def test_eligible_backends_explain_why_none() -> None:
    a, b = state("a"), state("b")
    assert eligible_backends([a, b], "m", exclude=["a"]) == [b]
    with pytest.raises(NoBackendError, match="no backend serves model 'x'"):
        eligible_backends([a], "x")
    with pytest.raises(NoBackendError, match="failed this request"):
        eligible_backends([a, b], "m", exclude=["a", "b"])
    a.healthy = False
    with pytest.raises(NoBackendError, match="failing its health checks"):
        eligible_backends([a], "m")
    with pytest.raises(NoBackendError, match="no backends"):
        eligible_backends([], "m")


def test_ejected_backends_are_avoided_but_used_when_all_are_ejected() -> None:
    config = EjectionConfig(consecutive_failures=1, base_lease_s=60, max_lease_s=60)
    a, b = state("a"), state("b")
    a.record_failure(config, "connect")
    assert eligible_backends([a, b], "m") == [b]
    b.record_failure(config, "connect")
    assert eligible_backends([a, b], "m") == [a, b]  # panic: better than a certain 503


def test_bad_plugin_names_and_args_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown scorer 'nope'; known: least_load"):
        pipeline(scorers=[{"name": "nope"}])
    with pytest.raises(ConfigError, match="rejects args"):
        pipeline(scorers=[{"name": "least_load", "args": {"x": 1}}])
    with pytest.raises(ConfigError, match="max_kv_usage"):
        Pipeline.from_config(
            PipelineConfig(filters=[PluginSpec(name="not_saturated", args={"max_kv_usage": 2})]),
            PluginContext(),
        )


def test_decision_header_is_compact() -> None:
    d = pipeline("least_load").decide(request(), [state("a", 1), state("b")])
    assert d.header() == "reason=least_load;candidates=2;score=1.000"
