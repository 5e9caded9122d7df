"""load_mode=auto's cost model: a slow-tier load goes into the step only when measured cheaper
there (or, rarely and small, to be measured)."""

from __future__ import annotations

import pytest

from kvstack.integrations.vllm.load_cost import PROBE_CHUNKS, PROBE_EVERY, LoadCost


def steps(cost: LoadCost, seconds: float, count: int = 5) -> None:
    for step in range(1, count + 1):
        cost.step_scheduled(step, 10.0 * step)
        cost.step_reported(step, 10.0 * step + seconds)


def test_with_nothing_measured_only_a_small_load_goes_into_the_step_to_be_measured() -> None:
    cost = LoadCost()
    assert not cost.within_step(PROBE_CHUNKS + 1, 0)
    assert cost.within_step(PROBE_CHUNKS, 0)  # the probe
    cost.observe_load(PROBE_CHUNKS, 4.0, within_step=True)  # it was slow: 1 s a chunk
    steps(cost, 0.050)
    assert not cost.within_step(1, 0)  # measured: 1 s > one 50 ms step


def test_until_measured_within_the_step_a_load_is_taken_as_fast_as_off_it() -> None:
    cost = LoadCost()
    steps(cost, 0.015)
    cost.observe_load(8, 8.0, within_step=False)  # 1 s a chunk off the step
    assert cost.within_step(8, 1)  # 8 s x 1 <= 8 s of waiting: into the step, measured there
    assert not cost.within_step(8, 2)  # it would stall two requests 8 s each


def test_a_load_cheaper_within_the_step_for_everyone_it_stalls_goes_there() -> None:
    cost = LoadCost()
    steps(cost, 0.015)  # 15 ms steps
    for _ in range(3):
        cost.observe_load(4, 0.012, within_step=True)  # 3 ms a chunk in the step
        cost.observe_load(4, 4.0, within_step=False)  # 1 s a chunk off it (starved threads)
    assert cost.within_seconds_per_chunk == pytest.approx(0.003)
    assert cost.within_step(16, 0)  # 48 ms in the step against 16 s of waiting
    assert cost.within_step(16, 3)  # 48 ms x 3 stalled requests, still far less


def test_a_load_that_would_stall_a_full_batch_stays_off_the_step() -> None:
    cost = LoadCost()
    steps(cost, 0.025)  # 25 ms decode steps of a large batch
    for _ in range(3):
        cost.observe_load(4, 0.040, within_step=True)  # 10 ms a chunk either way
        cost.observe_load(4, 0.040, within_step=False)
    assert not cost.within_step(4, 32)  # 40 ms x 32 requests against 40 ms of waiting
    assert cost.within_step(2, 1)  # 20 ms x 1 <= max(20 ms, one 25 ms step)
    assert cost.within_step(8, 1)  # 80 ms either way: a tie goes to the step
    assert not cost.within_step(8, 2)  # 80 ms x 2 stalled requests > 80 ms of waiting


def test_a_measurement_is_retaken_now_and_then_with_a_small_load() -> None:
    cost = LoadCost()
    steps(cost, 0.025)
    cost.observe_load(4, 4.0, within_step=True)  # measured while the engine was busy
    cost.observe_load(4, 0.040, within_step=False)
    answers = [cost.within_step(PROBE_CHUNKS, 1) for _ in range(PROBE_EVERY)]
    assert answers.count(True) == 1 and answers[-1]  # once, after PROBE_EVERY slow loads


def test_medians_resist_one_outlier_and_unreported_steps_are_dropped() -> None:
    cost = LoadCost(window=8)
    for step, seconds in enumerate([0.05, 0.05, 5.0, 0.05], start=1):  # one long prefill step
        cost.step_scheduled(step, 100.0)
        cost.step_reported(step, 100.0 + seconds)
    assert cost.step_seconds == pytest.approx(0.05)
    cost.step_scheduled(5, 1.0)
    cost.step_scheduled(6, 2.0)
    cost.step_reported(6, 2.05)  # step 5 never reported (no work reached the worker)
    cost.step_reported(5, 9.0)
    assert cost.step_seconds == pytest.approx(0.05)  # 5's late report is not timed as 8 s
    cost.step_reported(99, 3.0)  # never scheduled: ignored
    assert cost.step_seconds == pytest.approx(0.05)
