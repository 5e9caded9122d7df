"""LoRA affinity: adapter active > free adapter slot > must evict, from the engines' scraped
``vllm:lora_requests_info``, the router's own in-flight requests, and (when wired in) the LoRA
control plane's residency."""

from __future__ import annotations

import time
from types import SimpleNamespace

from kvstack.router.fleet.backends import Backend, BackendState
from kvstack.router.fleet.engine_metrics import ScrapedMetrics
from kvstack.router.request import RoutingRequest
from kvstack.router.scheduling.plugins import SCORERS, PluginContext


def backend(name: str, running: tuple[str, ...] = (), max_loras: int | None = 2) -> BackendState:
    s = BackendState(Backend(name, f"http://{name}:1"))
    s.set_models([{"id": "base"}, *({"id": a, "parent": "base"} for a in ("x", "y", "z"))], 0.0)
    s.set_engine_metrics(
        ScrapedMetrics(time.monotonic(), running=1, waiting=0, running_adapters=running,
                      max_loras=max_loras)
    )  # fmt: skip
    return s


def request(target: str) -> RoutingRequest:
    return RoutingRequest(request_id="r", endpoint="completions", model=target, target=target)


def test_active_beats_free_slot_beats_evict() -> None:
    scorer = SCORERS.get("lora_affinity")(PluginContext())
    active, free, full = backend("a", ("x",)), backend("b", ("y",)), backend("c", ("y", "z"))
    result = scorer.score(request("x"), [active, free, full])
    assert result.scores["a"] > result.scores["b"] > result.scores["c"]
    base = scorer.score(request("base"), [active, free, full])
    assert set(base.scores.values()) == {1.0}  # no preference for base-model requests


def test_router_in_flight_counts_before_any_scrape() -> None:
    scorer = SCORERS.get("lora_affinity")(PluginContext())
    cold, other = backend("a"), backend("b")
    req = request("z")
    assert (
        scorer.score(req, [cold, other]).scores["a"] == scorer.score(req, [cold, other]).scores["b"]
    )
    scorer.on_dispatch(req, cold)  # type: ignore[attr-defined]
    assert scorer.score(req, [cold, other]).scores["a"] == 1.0
    scorer.on_finish(req, cold, "ok")  # type: ignore[attr-defined]
    assert scorer.score(req, [cold, other]).scores["a"] < 1.0


def test_control_plane_residency_when_wired_in() -> None:
    tiers = {("http://a:1", "x"): "HOT", ("http://b:1", "x"): "WARM"}
    manager = SimpleNamespace(
        residency=lambda url, name: SimpleNamespace(value=tiers.get((url, name), "COLD"))
    )
    context = PluginContext(services={"lora": SimpleNamespace(manager=manager)})
    scorer = SCORERS.get("lora_affinity")(context)
    result = scorer.score(request("x"), [backend("a"), backend("b"), backend("c", ("y", "z"))])
    assert result.scores == {"a": 1.0, "b": 0.8, "c": 0.2}
