"""The simulator's OpenAI API through the official client, and vLLM's response shapes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.sim.conftest import FleetFactory

DATA = Path(__file__).parent / "data"
VLLM = json.loads((DATA / "vllm_http.json").read_text())


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_completion_and_chat_with_the_openai_client(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(time_scale=50)
    c = client(fleet.urls[0])
    out = c.completions.create(model="sim-model", prompt="t20 t21 t22", max_tokens=4)
    assert out.usage is not None and out.usage.prompt_tokens == 3
    assert out.usage.completion_tokens == 4 and len(out.choices[0].text.split()) == 4
    assert out.choices[0].finish_reason == "length"
    chat = c.chat.completions.create(
        model="sim-model", messages=[{"role": "user", "content": "hello there"}], max_tokens=2
    )
    assert (
        chat.usage is not None and chat.usage.prompt_tokens == 5
    )  # <|user|> 2 words <|end|> <|assistant|>
    assert chat.choices[0].message.role == "assistant"


def test_streaming_yields_tokens_and_usage(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(time_scale=5)
    c = client(fleet.urls[0])
    chunks = list(
        c.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "t30 t31"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [ch.choices[0].delta.content for ch in chunks if ch.choices]
    assert texts[0] == ""  # the role chunk
    # One chunk per step, or several tokens per chunk when this client lags (as in vLLM).
    assert all(texts[1:]) and len("".join(texts).split()) == 5
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}


def test_streams_start_at_the_first_token_as_vllms_do(sim_fleet: FleetFactory) -> None:
    """Nothing is streamed before the first token (a chat stream's role chunk comes with it), so
    a router reading the first body byte sees the end of the prefill, not the request's arrival;
    the first token goes out at once, then every ``stream_interval`` tokens."""
    # A 0.5 s prefill step: a role chunk sent on arrival would come long before any token; and
    # 0.25 s decode steps, so that the stream keeps up with every step even on a busy machine.
    fleet = sim_fleet(time_scale=1, prefill_tokens_per_s=20.0, step_base_s=0.25, stream_interval=4)
    url = fleet.urls[0]
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "t30 t31"}],
        "max_tokens": 9,
        "stream": True,
    }
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
        events = r.iter_lines()
        first = next(e for e in events if e.startswith("data: {"))
        first_tokens = sum(
            s.value
            for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)
            for s in f.samples
            if s.name == "vllm:time_to_first_token_seconds_count"
        )
        rest = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
    assert json.loads(first[6:])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first_tokens == 1  # the engine had produced the first token before the first byte
    contents = [c["choices"][0]["delta"]["content"] for c in rest if c["choices"]]
    assert [len(t.split()) for t in contents] == [1, 4, 4]


def test_token_id_prompts_and_the_request_id_header(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(time_scale=50)
    r = httpx.post(
        fleet.urls[0] + "/v1/completions",
        json={"prompt": [17, 18, 19, 20], "max_tokens": 1},
        headers={"x-request-id": "req-42"},
    )
    assert r.status_code == 200 and r.headers["x-request-id"] == "req-42"
    body = r.json()
    assert body["id"] == "cmpl-req-42" and body["usage"]["prompt_tokens"] == 4


def test_response_fields_cover_vllms(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(time_scale=50)
    url = fleet.urls[0]
    ours = httpx.post(url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 2}).json()
    theirs = json.loads(VLLM["completion"]["body"])
    important = {"id", "object", "created", "model", "choices", "usage"}
    assert important <= ours.keys() & theirs.keys()
    assert {"index", "text", "finish_reason"} <= ours["choices"][0].keys()
    stream = httpx.post(
        url + "/v1/completions",
        json={
            "prompt": "a b",
            "max_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert stream.headers["content-type"].startswith("text/event-stream")
    lines = [ln for ln in stream.text.split("\n\n") if ln]
    vllm_lines = [ln for ln in VLLM["completion_stream"]["body"].split("\n\n") if ln]
    assert lines[-1] == vllm_lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:]).keys() >= {"choices", "usage"}
    assert json.loads(lines[-2][6:])["choices"] == json.loads(vllm_lines[-2][6:])["choices"] == []


@pytest.mark.parametrize(
    ("body", "vllm_case"),
    [
        ({"model": "nope", "prompt": "x", "max_tokens": 2}, "bad_model"),
        ({"prompt": [20] * 5000, "max_tokens": 2}, "too_long"),
        ({"max_tokens": 2}, "missing_prompt"),
    ],
)
def test_errors_have_vllms_status_type_and_param(
    sim_fleet: FleetFactory, body: dict[str, object], vllm_case: str
) -> None:
    fleet = sim_fleet(time_scale=50, max_model_len=4096)
    r = httpx.post(fleet.urls[0] + "/v1/completions", json=body)
    expected = VLLM[vllm_case]
    assert r.status_code == expected["status"]
    ours, theirs = r.json()["error"], json.loads(expected["body"])["error"]
    assert (ours["type"], ours["param"], ours["code"]) == (
        theirs["type"],
        theirs["param"],
        theirs["code"],
    )
    if vllm_case == "too_long":
        assert ours["message"] == theirs["message"].replace("4995", "5000")


def test_lora_load_and_unload_follow_vllm(sim_fleet: FleetFactory, tmp_path: Path) -> None:
    fleet = sim_fleet(time_scale=50, enable_lora=True, lora_load_s=0.05)
    url = fleet.urls[0]
    (tmp_path / "a1").mkdir()

    def post(path: str, body: dict[str, object]) -> httpx.Response:
        return httpx.post(url + path, json=body)

    cases = {
        "lora_load_bad_path": post(
            "/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": "/nonexistent"}
        ),
        "lora_load": post(
            "/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": str(tmp_path / "a1")}
        ),
        "lora_load_dup": post(
            "/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": str(tmp_path / "a1")}
        ),
    }
    models = httpx.get(url + "/v1/models").json()["data"]
    assert [(m["id"], m["parent"]) for m in models] == [("sim-model", None), ("a1", "sim-model")]
    out = post("/v1/completions", {"model": "a1", "prompt": "t40", "max_tokens": 2})
    assert out.status_code == 200 and out.json()["model"] == "a1"
    cases["lora_unload"] = post("/v1/unload_lora_adapter", {"lora_name": "a1"})
    cases["lora_unload_unknown"] = post("/v1/unload_lora_adapter", {"lora_name": "zzz"})
    for name, response in cases.items():
        expected = VLLM[name]
        assert response.status_code == expected["status"], name
        if expected["status"] == 200:
            assert response.text == expected["body"]
        else:
            assert response.json()["error"]["type"] == json.loads(expected["body"])["error"]["type"]
    assert (
        cases["lora_load_bad_path"].json()["error"]["message"]
        == json.loads(VLLM["lora_load_bad_path"]["body"])["error"]["message"]
    )
    gone = post("/v1/completions", {"model": "a1", "prompt": "t40", "max_tokens": 2})
    assert gone.status_code == 404


def test_lora_endpoints_absent_without_enable_lora(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(time_scale=50)
    r = httpx.post(
        fleet.urls[0] + "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/"}
    )
    assert r.status_code == 404


def test_tokenize_and_health(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(time_scale=50)
    url = fleet.urls[0]
    assert httpx.get(url + "/health").status_code == 200
    r = httpx.post(url + "/tokenize", json={"prompt": "t20 t21"}).json()
    assert r["tokens"] == [20, 21] and r["count"] == 2


def test_a_client_leaving_mid_stream_aborts_the_request(sim_fleet: FleetFactory) -> None:
    fleet = sim_fleet(time_scale=1, step_base_s=0.01)
    url = fleet.urls[0]
    body = {"prompt": "t20 t21", "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body) as r:
        for _ in r.iter_lines():
            break  # read one event, then hang up
    engine = fleet.engines[0]
    deadline = time.monotonic() + 5
    while fleet.call(lambda: len(engine.scheduler.running)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fleet.call(lambda: len(engine.scheduler.running)) == 0
    assert fleet.call(lambda: engine.pool.num_free) == engine.pool.num_blocks
    text = httpx.get(url + "/metrics").text
    assert (
        'vllm:request_success_total{engine="0",finished_reason="abort",model_name="sim-model"} 1.0'
        in text
    )


def _prefix_hits(url: str) -> float:
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        if family.name == "vllm:prefix_cache_hits":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("no vllm:prefix_cache_hits")


def test_cache_salt_is_checked_and_keys_the_prefix_cache_as_vllms(sim_fleet: FleetFactory) -> None:
    from vllm.entrypoints.generate.base.protocol import validate_cache_salt

    url = sim_fleet(time_scale=50).urls[0]
    prompt = " ".join(f"t{i}" for i in range(200))  # 12 full blocks of 16

    def complete(salt: object) -> httpx.Response:
        body = {"prompt": prompt, "max_tokens": 1, "cache_salt": salt}
        return httpx.post(url + "/v1/completions", json=body)

    for bad in ("", "a/b", "a@b", "z" * 129, 5):
        answer = complete(bad)
        with pytest.raises(Exception) as vllm_says:  # vLLM raises its VLLMValidationError
            validate_cache_salt(bad)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "cache_salt"
        # vLLM's server adds the parameter to its validator's message
        assert (
            answer.json()["error"]["message"] == f"{vllm_says.value.args[0]} (parameter=cache_salt)"
        )
    assert complete("tenant-1").status_code == 200
    before = _prefix_hits(url)
    assert complete("tenant-1").status_code == 200
    assert _prefix_hits(url) - before == 192  # the same salt hits
    before = _prefix_hits(url)
    assert complete("tenant-2").status_code == 200
    assert _prefix_hits(url) == before  # another salt does not


def test_an_api_key_guards_v1_as_vllms_does(sim_fleet: FleetFactory) -> None:
    url = sim_fleet(time_scale=50, api_key="engine-key").urls[0]
    body = {"prompt": "t1 t2", "max_tokens": 1}
    refused = httpx.post(url + "/v1/completions", json=body)
    assert refused.status_code == 401 and refused.json() == {"error": "Unauthorized"}
    assert httpx.get(url + "/v1/models").status_code == 401
    wrong = {"authorization": "Bearer nope"}
    assert httpx.post(url + "/v1/completions", json=body, headers=wrong).status_code == 401
    right = {"authorization": "Bearer engine-key"}
    assert httpx.post(url + "/v1/completions", json=body, headers=right).status_code == 200
    for open_path in ("/health", "/metrics"):
        assert httpx.get(url + open_path).status_code == 200
