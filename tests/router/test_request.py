"""The request's typed state: what stages leave there, and what it releases at the end."""

from __future__ import annotations

from typing import Any

from kvstack.router.request import RequestState, RoutingRequest


class _Counted:
    def __init__(self) -> None:
        self.released = 0

    def release(self) -> None:
        self.released += 1


class _Decision:
    """Stands for the adapter manager's decision: finished exactly once."""

    def __init__(self) -> None:
        self.finished: list[bool] = []

    def finish(self, ttft_s: float | None = None, ok: bool = True, served: Any = None) -> None:
        self.finished.append(ok)


def test_release_returns_the_permit_once_and_fails_the_decisions_no_attempt_finished() -> None:
    permit, decision = _Counted(), _Decision()
    state = RequestState(permit=permit)
    state.adapter_decisions["a"] = decision  # type: ignore[assignment]
    state.release()
    state.release()
    assert permit.released == 1 and decision.finished == [False]
    assert state.permit is None and state.adapter_decisions == {}


def test_prefill_tokens_prefer_the_cost_models_estimate_and_a_new_target_starts_empty() -> None:
    request = RoutingRequest(
        request_id="r", endpoint="chat", model="m", target="m", token_ids=[1, 2, 3, 4]
    )
    assert request.prefill_tokens("a") == 4 and request.path == "/v1/chat/completions"
    request.state.uncached_tokens["a"] = 1.5
    assert request.prefill_tokens("a") == 1 and request.prefill_tokens("b") == 4
    moved = request.with_target("base", priority="critical")
    assert (moved.target, moved.priority, moved.state.uncached_tokens) == ("base", "critical", {})
