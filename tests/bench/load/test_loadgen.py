"""The load generator against the simulator: open and closed loop, timing, errors, seeds."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvstack.bench.load.loadgen import LoadPlan, run_load
from kvstack.bench.load.stats import SLO, summarize
from kvstack.bench.workloads import make_workload
from kvstack.bench.workloads.prompts import SimPromptBuilder
from tests.bench.conftest import FleetFactory, SimProcessFactory

BUILDER = SimPromptBuilder()
UNIQUE = {"prompt_tokens": 200, "output_tokens": 10}
TIMING = {
    "step_base_s": 0.02,
    "prefill_tokens_per_s": 4000.0,
    "decode_per_seq_s": 0.002,
    "decode_per_context_token_s": 0.0,
}


def load(url: str, plan: LoadPlan, name: str = "unique", params: dict | None = None, **kw: object):  # type: ignore[no-untyped-def]
    workload = make_workload(name, params or UNIQUE, BUILDER, plan.seed)
    return asyncio.run(run_load(url, workload, plan, **kw))  # type: ignore[arg-type]


def engine_total(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name)  # fmt: skip


def engine_mean(url: str, name: str) -> float:
    return engine_total(url, name + "_sum") / engine_total(url, name + "_count")


def test_open_loop_measures_what_the_engine_saw(sim_process: SimProcessFactory) -> None:
    # Stalls over 5 ms count as lag. The client's clock sees a stall the engine's model does
    # not, so lag widens the tolerance by its own size (a bound: each stall delays at most the
    # few requests in flight, by its length); a host that starved the engine of more than
    # 0.1 s in 6 s skips the comparison.
    (url,) = sim_process(**(TIMING | {"prefill_tokens_per_s": 8000.0, "catch_up_wall_s": 0.005}))
    plan = LoadPlan(rate=10.0, duration_s=6.0, seed=1)  # prefill 25% busy
    run = load(url, plan)
    n = len(run.results)
    assert 60 * 0.6 < n < 60 * 1.4  # Poisson: 60 expected
    assert all(r.ok and r.output_tokens == 10 and r.prompt_tokens == 200 for r in run.results)
    summary = summarize(run.results, run.duration_s, SLO()).overall
    assert summary.prompt_tokens_mismatched == 0
    lag = engine_total(url, "kvstack_sim_step_lag_seconds_total")
    if lag > 0.1:
        pytest.skip(f"this machine starved the simulator of CPU ({lag:.3f} s of step lag)")
    # The client sees what the engine saw, plus a little HTTP time.
    ttft = engine_mean(url, "vllm:time_to_first_token_seconds")
    tpot = engine_mean(url, "vllm:request_time_per_output_token_seconds")
    assert ttft >= 0.02 + 200 / 8000  # never faster than one prefill step
    assert summary.ttft_s.mean == pytest.approx(ttft, rel=0.15, abs=0.02 + lag)
    assert summary.tpot_s.mean == pytest.approx(tpot, rel=0.15, abs=0.005 + lag / 10)


def test_time_scale_converts_rates_and_times(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(time_scale=10, **TIMING)
    plan = LoadPlan(rate=2.0, duration_s=20.0, seed=1, time_scale=10)  # 2 s of wall time
    run = load(fleet.urls[0], plan)
    assert 40 * 0.6 < len(run.results) < 40 * 1.4  # 2/s for 20 simulated seconds
    scheduled = [r.scheduled_s for r in run.results if r.scheduled_s is not None]
    assert len(scheduled) == len(run.results)
    assert 15.0 < max(scheduled) < 20.0  # planned offsets, in simulated seconds
    assert all(r.start_s >= (r.scheduled_s or 0) - 1e-9 for r in run.results)
    assert run.duration_s >= 20.0
    ttfts = sorted(r.ttft_s for r in run.results if r.ttft_s is not None)
    assert ttfts[0] >= 0.07  # one prefill step of the model, not of the wall clock


def test_closed_loop_keeps_the_concurrency(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(time_scale=20, **TIMING)
    plan = LoadPlan(concurrency=4, duration_s=6.0, time_scale=20)
    run = load(fleet.urls[0], plan)
    starts = sorted(r.start_s for r in run.results)
    assert len(run.results) >= 8
    ends = sorted(r.start_s + (r.e2e_s or 0) for r in run.results)
    # at any request's start at most 4 are in flight (including it)
    for s in starts:
        in_flight = sum(1 for r in run.results if r.start_s <= s < r.start_s + (r.e2e_s or 0))
        assert in_flight <= 4
    assert ends[-1] >= 6.0 * 0.9


def test_errors_are_counted_not_raised(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(time_scale=20)
    plan = LoadPlan(rate=50.0, duration_s=2.0, time_scale=20)
    run = load(fleet.urls[0], plan, model="no-such-model")
    summary = summarize(run.results, run.duration_s, SLO()).overall
    assert summary.num_ok == 0 and summary.num_errors == summary.num_requests > 0
    assert all(r.status == 404 and "does not exist" in (r.error or "") for r in run.results)


def test_same_seed_same_run(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(time_scale=20)
    plan = LoadPlan(rate=30.0, duration_s=3.0, seed=7, time_scale=20)
    params = {
        "groups": 3,
        "users_per_group": 2,
        "system_prompt_tokens": 64,
        "question_tokens": 8,
        "output_tokens": 4,
    }
    first = load(fleet.urls[0], plan, "shared-prefix", params)
    second = load(fleet.urls[0], plan, "shared-prefix", params)
    assert len(first.results) == len(second.results)
    for a, b in zip(first.results, second.results, strict=True):
        assert a.expected_prompt_tokens == b.expected_prompt_tokens
        assert a.scheduled_s == b.scheduled_s  # the same arrival offsets
        assert a.scheduled_s is not None and a.start_s >= a.scheduled_s - 1e-9
    other = load(
        fleet.urls[0],
        LoadPlan(rate=30.0, duration_s=3.0, seed=8, time_scale=20),
        "shared-prefix",
        params,
    )
    assert [r.scheduled_s for r in other.results] != [r.scheduled_s for r in first.results]


def test_plan_validation() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        LoadPlan(rate=1.0, concurrency=2)
    with pytest.raises(ValueError, match="rate must be > 0"):
        LoadPlan(rate=0.0)
