"""The simulator's request validation against vLLM's: every case of
``tests/sim/data/vllm_validation.json`` (recorded from a real engine, and checked against one in
``tests/router/test_vllm_api.py``) gets the same status, and errors the same ``type`` and
``param`` in vLLM's ``ErrorResponse`` shape; batches and ``n`` answer as vLLM does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvstack.sim.config import SimConfig
from kvstack.sim.server import FleetThread, SimEngineSpec
from kvstack.stack.ports import free_port
from tests.router.vllm_schema import assert_vllm_error

CASES = json.loads((Path(__file__).parent / "data" / "vllm_validation.json").read_text())["cases"]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    # As the recording's engine: served as "toy", max_model_len 2048.
    config = SimConfig(model="toy", max_model_len=2048, time_scale=50)
    with FleetThread([SimEngineSpec(config, free_port())]) as fleet:
        yield fleet.urls[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_simulator_validates_as_vllm_does(url: str, name: str) -> None:
    case = CASES[name]
    response = httpx.post(url + case["path"], json=case["body"], timeout=30)
    assert response.status_code == case["status"], response.text
    if case["status"] == 200:
        return
    body = response.json()
    assert_vllm_error(body, case["status"])
    assert body["error"]["type"] == case["type"], body
    if "param" in case:
        assert body["error"]["param"] == case["param"], body


def test_a_batch_asked_twice_each_gets_four_choices_in_vllms_order(url: str) -> None:
    body = {"model": "toy", "prompt": ["t20 t21", "t30 t31 t32"], "max_tokens": 3, "n": 2}
    answer = httpx.post(url + "/v1/completions", json=body, timeout=30).json()
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
    assert all(len(c["text"].split()) == 3 for c in answer["choices"])
    # Each prompt counted once, every generated token counted.
    assert answer["usage"]["prompt_tokens"] == 2 + 3
    assert answer["usage"]["completion_tokens"] == 4 * 3


def test_a_streamed_batch_finishes_every_choice(url: str) -> None:
    body = {"model": "toy", "prompt": [[20, 21], [30]], "max_tokens": 4, "n": 2,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    text = httpx.post(url + "/v1/completions", json=body, timeout=30).text
    events = [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]
    words: dict[int, int] = {}
    finished = set()
    for event in events:
        for choice in event["choices"]:
            words[choice["index"]] = words.get(choice["index"], 0) + len(choice["text"].split())
            if choice["finish_reason"] is not None:
                finished.add(choice["index"])
    assert words == {0: 4, 1: 4, 2: 4, 3: 4} and finished == {0, 1, 2, 3}
    assert events[-1]["usage"]["completion_tokens"] == 16
    assert text.endswith("data: [DONE]\n\n")


def test_detokenize_inverts_tokenize(url: str) -> None:
    tokens = httpx.post(url + "/tokenize", json={"model": "toy", "prompt": "t40 t41"}).json()
    assert tokens["tokens"] == [40, 41]
    text = httpx.post(url + "/detokenize", json={"model": "toy", "tokens": tokens["tokens"]})
    assert text.json() == {"prompt": " t40 t41"}


def test_unknown_paths_and_methods_get_vllms_fastapi_answers(url: str) -> None:
    # vLLM's server is a FastAPI app whose ErrorResponse handler covers FastAPI's own
    # HTTPException only: a path or method with no route gets FastAPI's {"detail": ...}.
    missing = httpx.post(url + "/v1/nothing", json={})
    assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})
    wrong = httpx.get(url + "/v1/completions")
    assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})
