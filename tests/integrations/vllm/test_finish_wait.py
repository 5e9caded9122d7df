"""The bounded wait at a step's end: how long a step may wait for a load about to finish."""

from __future__ import annotations

import pytest

from kvstack.integrations.vllm.finish_wait import FinishWait


def timed(wait: FinishWait, steps: list[float], stepping: int = 4) -> None:
    now = 100.0
    for seconds in steps:
        wait.step_began(stepping, now)
        wait.step_ended(now + seconds)
        now += seconds + 0.001


def test_nothing_is_waited_for_until_steps_and_fetches_are_timed() -> None:
    wait = FinishWait(0.25)
    assert wait.budget() == 0.0
    timed(wait, [0.008])
    assert wait.budget() == 0.0, "no fetch timed yet: no prediction to wait on"
    wait.observe_fetch(4, 0.004)
    assert wait.budget() > 0.0 and wait.seconds_per_chunk == pytest.approx(0.001)


def test_the_wait_is_the_smaller_of_the_cap_and_a_step_shared_by_the_requests_stepping() -> None:
    wait = FinishWait(0.25)
    wait.observe_fetch(1, 0.001)
    timed(wait, [0.008, 0.008, 0.1], stepping=2)  # a median step of 8 ms
    assert wait.step_seconds == pytest.approx(0.008)
    assert wait.budget() == pytest.approx(0.002)  # the cap: a quarter of a step
    timed(wait, [0.008] * 3, stepping=8)
    assert wait.budget() == pytest.approx(0.001)  # 8 requests stepping: an eighth of a step


def test_steps_without_requests_stepping_are_not_timed() -> None:
    wait = FinishWait(0.25)
    wait.observe_fetch(1, 0.001)
    timed(wait, [0.5], stepping=0)  # only a request waiting for its load: nothing computes
    assert wait.step_seconds is None and wait.budget() == 0.0
    wait.step_ended(200.0)  # a get_finished without its metadata: nothing to time
    assert wait.step_seconds is None


def test_a_cap_of_zero_never_waits() -> None:
    wait = FinishWait(0.0)
    wait.observe_fetch(1, 0.001)
    timed(wait, [0.008])
    assert wait.budget() == 0.0
