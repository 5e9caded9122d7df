"""The circuit breaker's states, with a fake clock."""

from __future__ import annotations

import logging

import pytest

from kvstack.errors import ConfigError
from kvstack.kv.tiers.remote.breaker import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_consecutive_failures_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    breaker = CircuitBreaker("t", failure_threshold=2, reset_after_s=5, clock=clock)
    with caplog.at_level(logging.INFO):
        assert breaker.allow()
        breaker.failure("boom")
        breaker.success()  # not consecutive
        breaker.failure("boom")
        assert breaker.state == "closed"
        breaker.failure("boom")
        assert breaker.state == "open" and not breaker.allow() and breaker.refused == 1
        for _ in range(10):
            breaker.failure("boom")  # failures while open are not new incidents
        clock.now += 5
        assert breaker.state == "half-open"
        assert breaker.allow() and not breaker.allow()  # one trial at a time
        breaker.failure("still down")
        assert breaker.state == "open" and breaker.trips == 1  # same incident
        clock.now += 5
        assert breaker.allow()
        breaker.success()
        assert breaker.state == "closed" and breaker.allow()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("circuit breaker open" in m for m in messages) == 1
    assert sum("recovered after 10.0 s" in m for m in messages) == 1


def test_a_lost_trial_report_does_not_keep_the_breaker_open() -> None:
    clock = Clock()
    breaker = CircuitBreaker("t", failure_threshold=1, reset_after_s=1, clock=clock)
    breaker.failure("x")
    clock.now += 1
    assert breaker.allow()  # the trial's caller never reports back
    assert not breaker.allow()
    clock.now += 1
    assert breaker.allow()


def test_breaker_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="threshold"):
        CircuitBreaker("t", failure_threshold=0)
    with pytest.raises(ConfigError, match="reset time"):
        CircuitBreaker("t", reset_after_s=0)
