"""InferencePool, InferenceObjective and InferenceModel watches with the official client against
the kube-API double the router's discovery tests use. The objects are shaped like GIE's
documented examples (written here by hand)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from kvstack.errors import ConfigError
from kvstack.router.epp.config import EppConfig
from kvstack.router.epp.objectives import priority_band
from tests.router.conftest import engines, until
from tests.router.epp.conftest import serve_epp
from tests.router.fake_engine import FakeEngine
from tests.router.fake_kube import FakeKube, pod

POOL_API = "inference.networking.k8s.io/v1"
X_API = "inference.networking.x-k8s.io/v1alpha2"
POOL = "vllm-llama3-8b-instruct"
LABELS = {"app": POOL}


def inference_pool(ports: list[int]) -> dict[str, Any]:
    return {
        "apiVersion": POOL_API,
        "kind": "InferencePool",
        "metadata": {"name": POOL, "namespace": "llm"},
        "spec": {
            "targetPorts": [{"number": p} for p in ports],
            "selector": {"matchLabels": LABELS},
            "endpointPickerRef": {"name": f"{POOL}-epp", "port": {"number": 9002},
                                  "failureMode": "FailClose"},
        },
    }  # fmt: skip


def objective(name: str, priority: int | None, pool: str = POOL) -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": {"group": "inference.networking.k8s.io", "name": pool}}
    if priority is not None:
        spec["priority"] = priority
    meta = {"name": name, "namespace": "llm"}
    return {"apiVersion": X_API, "kind": "InferenceObjective", "metadata": meta, "spec": spec}


def inference_model(name: str, criticality: str, targets: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "apiVersion": X_API,
        "kind": "InferenceModel",
        "metadata": {"name": name, "namespace": "llm"},
        "spec": {
            "modelName": name,
            "criticality": criticality,
            "poolRef": {"name": POOL},
            "targetModels": [{"name": n, "weight": w} for n, w in targets],
        },
    }


def pool_config(kube: FakeKube, **overrides: Any) -> dict[str, Any]:
    pool = {"name": POOL, "namespace": "llm", "api_url": kube.url, "watch_timeout_s": 1,
            "inference_models": True, **overrides}  # fmt: skip
    return {"pool": pool}


async def test_the_pool_objectives_and_models_drive_the_picks() -> None:
    a = FakeEngine("a", models=["llama", "food-review-1", "food-review-2"])
    b = FakeEngine("b", models=["llama", "food-review-1", "food-review-2"])
    async with engines(a, b) as [a, b], FakeKube().running() as kube:
        await kube.put(inference_pool([a.port, b.port]), plural="inferencepools")
        await kube.put(pod("vllm-0", labels=LABELS))  # one pod, two ranks (target ports)
        await kube.put(pod("web-0", labels={"app": "web"}))  # not the pool's
        for obj in (
            objective("food-review", 1),
            objective("batch", -10),
            objective("base-model", None),
            objective("elsewhere", 5, pool="other"),
        ):
            await kube.put(obj, plural="inferenceobjectives")  # fmt: skip
        model = inference_model("food-review", "Sheddable", [("food-review-1", 100)])
        await kube.put(model, plural="inferencemodels")
        async with serve_epp([], pool_config(kube)) as epp:
            router = epp.server.router
            ids = sorted(s.id for s in router.pool.states())
            assert ids == sorted(f"llm/vllm-0:{p}" for p in (a.port, b.port))
            book = epp.server.picker.objectives
            assert book.objectives == {
                "food-review": "critical", "batch": "sheddable", "base-model": "standard",
            }  # fmt: skip
            assert book.model_priorities == {"food-review": "sheddable"}
            await until(lambda: all(s.models for s in router.pool.states()))
            body = {"model": "food-review", "prompt": "a review", "max_tokens": 2}
            answer = await epp.envoy.pick("/v1/completions", body)
            assert answer.json["model"] == "food-review-1"  # the InferenceModel's target
            assert answer.endpoint in (epp.endpoint(a), epp.endpoint(b))

            await kube.put(inference_pool([b.port]), plural="inferencepools")  # a rank gone
            await until(lambda: [s.id for s in router.pool.states()] == ["llm/vllm-0"])
            await kube.put(inference_model("food-review", "Critical", [("food-review-2", 1)]),
                           plural="inferencemodels")  # fmt: skip
            await until(lambda: book.model_priorities == {"food-review": "critical"})
            await until(lambda: router.pool.states()[0].models != frozenset())
            answer = await epp.envoy.pick("/v1/completions", body)
            assert answer.endpoint == epp.endpoint(b) and answer.json["model"] == "food-review-2"
            await kube.delete("batch", collection=f"{X_API}/inferenceobjectives")
            await until(lambda: "batch" not in book.objectives)


def test_priority_bands() -> None:
    assert [priority_band(p) for p in (None, 0, 1, 10, -1)] == [
        "standard", "standard", "critical", "critical", "sheddable",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="integer"):
        priority_band("high")


def test_unknown_api_versions_are_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="unknown InferencePool API version"):
        EppConfig.model_validate(
            {"pool": {"name": "p", "api_version": "inference.networking.k8s.io/v2"}}
        )
    with pytest.raises(
        ValidationError, match=re.escape("kvstack reads inference.networking.x-k8s.io/v1alpha2")
    ):
        EppConfig.model_validate(
            {"pool": {"objective_api_version": "inference.networking.x-k8s.io/v1"}}
        )


async def test_a_version_the_cluster_does_not_serve_fails_the_start_clearly() -> None:
    async with FakeKube().running() as kube:
        await kube.put(inference_pool([8000]), plural="inferencepools")  # objectives: no CRD
        with pytest.raises(ConfigError, match="does not serve inferenceobjectives"):
            async with serve_epp([], pool_config(kube, inference_models=False)):
                pass


async def test_the_older_v1alpha2_pool_shape_is_read() -> None:
    engine = FakeEngine("a", models=["llama"])
    async with engines(engine) as [engine], FakeKube().running() as kube:
        old = {"apiVersion": X_API, "kind": "InferencePool",
               "metadata": {"name": POOL, "namespace": "llm"},
               "spec": {"selector": LABELS, "targetPortNumber": engine.port,
                        "extensionRef": {"name": "epp"}}}  # fmt: skip
        await kube.put(old, plural="inferencepools")
        await kube.put(pod("vllm-0", labels=LABELS))
        kube.install(X_API, "inferenceobjectives")
        config = pool_config(kube, api_version=X_API, inference_models=False)
        async with serve_epp([], config) as epp:
            assert [s.id for s in epp.server.router.pool.states()] == ["llm/vllm-0"]
            answer = await epp.envoy.pick("/v1/completions", {"model": "llama", "prompt": "x"})
            assert answer.endpoint == epp.endpoint(engine)
