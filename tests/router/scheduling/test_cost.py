"""The predicted-TTFT cost model and the scorers over it, on in-process backend states."""

from __future__ import annotations

import random
import time

import pytest

from kvstack.errors import ConfigError
from kvstack.router.config import PipelineConfig, PluginSpec, RouterConfig
from kvstack.router.fleet.backends import Backend, BackendState
from kvstack.router.fleet.engine_metrics import ScrapedMetrics
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.cost_model import CostInputs, CostModel, CostPrior
from kvstack.router.scheduling.pipeline import Pipeline
from kvstack.router.scheduling.plugins import PICKERS, Candidate, PluginContext
from kvstack.router.scheduling.services import prefix_state

SYSTEM = " ".join(f"t{i}" for i in range(100, 1100))  # 1,000 tokens for the sim tokenizer


def backend(name: str, kv: float | None = None) -> BackendState:
    s = BackendState(Backend(name, f"http://{name}:1", static_models=frozenset({"m"})))
    if kv is not None:
        s.set_engine_metrics(ScrapedMetrics(time.monotonic(), running=0, waiting=0, kv_usage=kv))
    return s


def request(question: str, stream: bool = True) -> RoutingRequest:
    return RoutingRequest(
        request_id=question,
        endpoint="completions",
        model="m",
        target="m",
        prompt=f"{SYSTEM} {question}",
        stream=stream,
        arrival_s=time.perf_counter(),
    )


def context() -> PluginContext:
    config = RouterConfig.model_validate({"prefix": {"tokenizers": {"m": "sim"}}})
    ctx = PluginContext(rng=random.Random(0), config=config)
    from kvstack.router.scheduling.tokenizers import make_tokenizer

    prefix_state(ctx).renderer._tokenizers["m"] = make_tokenizer("sim")
    return ctx


def ttft_pipeline(ctx: PluginContext, **args: object) -> Pipeline:
    spec = PipelineConfig(scorers=[PluginSpec(name="ttft", args=args)])
    return Pipeline.from_config(spec, ctx)


def test_the_model_learns_the_true_rates() -> None:
    true = CostModel(CostPrior(prefill_tokens_per_s=2000, base_s=0.05, per_running_s=0.01))
    model = CostModel(CostPrior(prefill_tokens_per_s=8000), learning_rate=0.2)
    rng = random.Random(3)
    for _ in range(2000):
        x = CostInputs(rng.uniform(0, 8000), rng.uniform(1, 4000), rng.uniform(0, 40))
        model.observe("a", x, true.predict("a", x).ttft_s * rng.uniform(0.95, 1.05))
    base, rate, per_running = model.rates("a")
    assert base == pytest.approx(0.05, abs=0.03)
    assert rate == pytest.approx(2000, rel=0.15)
    assert per_running == pytest.approx(0.01, rel=0.3)
    x = CostInputs(3000, 1000, 10)
    assert model.predict("a", x).ttft_s == pytest.approx(true.predict("a", x).ttft_s, rel=0.1)


def test_kv_pressure_raises_the_prediction() -> None:
    model = CostModel()
    calm = model.predict("a", CostInputs(0, 1000, 1, kv_usage=0.5)).ttft_s
    full = model.predict("a", CostInputs(0, 1000, 1, kv_usage=0.99)).ttft_s
    assert full > 3 * calm
    with pytest.raises(ValueError, match="kv_threshold"):
        CostModel(kv_threshold=1.0)


def test_cached_prefix_wins_until_its_queue_costs_more_than_recomputing() -> None:
    ctx = context()
    pipeline = ttft_pipeline(ctx, prefill_tokens_per_s=1000.0, base_s=0.0, per_running_s=0.0)
    state = prefix_state(ctx)
    a, b = backend("a"), backend("b")
    state.on_dispatch(request("q0"), a)  # a holds the system prompt now (routed belief)
    decision = pipeline.decide(request("q1"), [a, b])
    assert decision.backend.id == "a" and decision.reason == "ttft"
    assert "uncached=" in decision.header() and "routed:992/1001" in decision.header()
    for _ in range(3):  # 3,000 tokens of prefill queued on a: recomputing on b is cheaper
        a.load.acquire(1000)
    assert pipeline.decide(request("q2"), [a, b]).backend.id == "b"


def test_a_hot_prefix_spreads_through_the_pipeline_and_in_flight_accounting() -> None:
    ctx = context()
    pipeline = ttft_pipeline(ctx, prefill_tokens_per_s=1000.0, base_s=0.0, per_running_s=0.0)
    state = prefix_state(ctx)
    backends = [backend(n) for n in "abcd"]
    chosen = []
    for i in range(40):  # a burst: nothing finishes, every decision sees the leases before it
        req = request(f"q{i}")
        decision = pipeline.decide(req, backends)
        target = decision.backend  # the live state: the lease goes on it
        target.load.acquire(req.prefill_tokens(target.id))
        state.on_dispatch(req, target)
        chosen.append(decision.backend.id)
    counts = {n: chosen.count(n) for n in "abcd"}
    assert max(counts.values()) < 30 and min(counts.values()) >= 3, counts
    # Once the prefix is everywhere, the burst keeps the per-backend queues level.
    assert chosen[-8:].count(chosen[-1]) < 8


def test_kv_usage_steers_away_from_a_full_backend() -> None:
    ctx = context()
    pipeline = ttft_pipeline(ctx)
    full, calm = backend("full", kv=0.99), backend("calm", kv=0.3)
    assert pipeline.decide(request("x"), [full, calm]).backend.id == "calm"


def test_learning_from_first_tokens_of_streams_only() -> None:
    ctx = context()
    pipeline = ttft_pipeline(ctx, learn=True)
    scorer = pipeline.scorers[0].scorer
    a = backend("a")
    for stream in (False, True):
        req = request("x", stream=stream)
        scorer.score(req, [a])
        scorer.on_dispatch(req, a)  # type: ignore[attr-defined]
        scorer.on_first_token(req, a, 5.0)  # type: ignore[attr-defined]
    from kvstack.router.scheduling.services import cost_model

    assert cost_model(ctx).fleet.samples == 1


def test_learning_is_opt_in() -> None:
    ctx = context()
    scorer = ttft_pipeline(ctx).scorers[0].scorer
    a, req = backend("a"), request("x", stream=True)
    scorer.score(req, [a])
    scorer.on_dispatch(req, a)  # type: ignore[attr-defined]
    scorer.on_first_token(req, a, 5.0)  # type: ignore[attr-defined]
    from kvstack.router.scheduling.services import cost_model

    assert cost_model(ctx).fleet.samples == 0


def test_bad_scorer_args_are_config_errors() -> None:
    ctx = context()
    with pytest.raises(ConfigError, match="prefill_tokens_per_s"):
        ttft_pipeline(ctx, prefill_tokens_per_s=0)
    with pytest.raises(ConfigError, match="temperature"):
        Pipeline.from_config(
            PipelineConfig(picker=PluginSpec(name="softmax", args={"temperature": -1})), ctx
        )


def test_softmax_picker_spreads_near_ties_and_is_argmax_at_zero() -> None:
    ctx = PluginContext(rng=random.Random(1))
    cands = [
        Candidate(backend("a"), 1.0),
        Candidate(backend("b"), 0.98),
        Candidate(backend("c"), 0.2),
    ]
    greedy = PICKERS.get("softmax")(ctx, temperature=0.0)  # type: ignore[call-arg]
    assert {greedy.pick(request("x"), cands).backend.id for _ in range(20)} == {"a"}
    soft = PICKERS.get("softmax")(ctx, temperature=0.05)  # type: ignore[call-arg]
    picks = [soft.pick(request("x"), cands).backend.id for _ in range(400)]
    assert picks.count("b") > 100 and picks.count("c") < 5


def test_precise_fullness_counts_prompts_in_flight_before_their_events() -> None:
    """A prompt's blocks reach the KV events only after its prefill; until then the request
    in flight counts, or a burst would see an engine as empty and pile onto it."""
    ctx = context()
    state = prefix_state(ctx)
    b = backend("a")
    b.set_engine_metrics(
        ScrapedMetrics(time.monotonic(), running=0, waiting=0, block_size=16, num_gpu_blocks=256)
    )
    state.started(b.id, complete=True)  # precise: the engine's events are the belief
    assert state.is_precise(b.id) and state.fullness(b, precise=True) == 0.0
    for i in range(2):
        state.on_dispatch(request(f"q{i}"), b)
    # Two 1,001-token prompts whose whole pages (62 of 16 tokens) are the shared ones.
    assert state.fullness(b, precise=True) == pytest.approx(62 * 16 / 4096)
