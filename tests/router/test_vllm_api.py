"""vLLM's whole API through the router, against one real vLLM CPU engine (module-scoped).

The engine runs kvstack's connector configured the LMCache way (``LMCACHE_CONFIG_FILE``); one
router is started with production-stack's flags, one with kvstack's own. The official
``openai`` client's Responses API, an Anthropic Messages request, ``/tokenize`` and
``/detokenize`` go through them; both routers serve the same greedy answers; the engine's
routes, validation and error bodies are held to what the committed schema and recordings say.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from kvstack.bench.micro.vllm_probe import reset_prefix_cache
from kvstack.router.http.parse import parse_request
from kvstack.router.http.routes import match_route
from kvstack.stack.ports import free_port
from kvstack.stack.procs import ManagedProcess
from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec
from tests.e2e.engines import metric_total, wait_metric
from tests.router.vllm_schema import assert_vllm_error

pytestmark = pytest.mark.vllm

VALIDATION = json.loads(
    (Path(__file__).parents[1] / "sim" / "data" / "vllm_validation.json").read_text()
)["cases"]
HITS = "kvstack_connector_hit_tokens_total"
LMCACHE_CONFIG = """\
chunk_size: 256
local_cpu: true
max_local_cpu_size: 0.25
remote_serde: naive
save_decode_cache: false
"""


@dataclass
class Setup:
    engine: VLLMServer
    prodstack_url: str  # a router started with production-stack's flags
    native_url: str  # a router started with kvstack's own flags

    def client(self, url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def _router(name: str, argv: list[str], logs: Path) -> tuple[ManagedProcess, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "kvstack", "router", "--host", "127.0.0.1", "--port", str(port)]
    router = ManagedProcess(name, cmd + argv, logs / f"{name}.log").start()
    router.wait_healthy(f"http://127.0.0.1:{port}/health", 60)
    return router, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def setup(toy_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    logs = tmp_path_factory.mktemp("vllm-api")
    (logs / "lmcache.yaml").write_text(LMCACHE_CONFIG)
    transfer = {"kv_connector": "KVStackConnector", "kv_role": "kv_both",
                "kv_connector_module_path": "kvstack.integrations.vllm",
                "kv_connector_extra_config": {}}  # fmt: skip
    spec = VLLMServerSpec(
        model=str(toy_model), port=free_port(), served_model_name="toy", max_model_len=2048,
        kv_transfer_config=transfer,
        env={"LMCACHE_CONFIG_FILE": str(logs / "lmcache.yaml"), "VLLM_SERVER_DEV_MODE": "1",
             "VLLM_ENABLE_RESPONSES_API_STORE": "1"},
    )  # fmt: skip
    engine = VLLMServer(spec, logs / "engine.log")
    routers: list[ManagedProcess] = []
    try:
        engine.start()
        prodstack = ["--service-discovery", "static", "--static-backends", engine.url,
                     "--static-models", "toy", "--routing-logic", "prefixaware",
                     "--session-key", "x-user-id"]  # fmt: skip
        process, prodstack_url = _router("prodstack-router", prodstack, logs)
        routers.append(process)
        process, native_url = _router("native-router", ["--backend", engine.url,
                                                        "--policy", "prefix"], logs)  # fmt: skip
        routers.append(process)
        yield Setup(engine, prodstack_url, native_url)
    finally:
        for process in routers:
            process.stop()
        engine.stop()


def test_responses_api_with_the_openai_client(setup: Setup) -> None:
    client = setup.client(setup.prodstack_url)
    raw = client.responses.with_raw_response.create(
        model="toy", input="the cache", instructions="answer briefly", max_output_tokens=4
    )
    assert raw.headers["x-kvstack-backend"] == setup.engine.url
    first = raw.parse()
    assert first.id.startswith("resp_") and first.usage is not None
    assert first.usage.output_tokens == 4 and first.output_text
    events = list(
        client.responses.create(model="toy", input="a stream", max_output_tokens=4, stream=True)
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert sum(kind == "response.output_text.delta" for kind in kinds) >= 2
    # Stored (VLLM_ENABLE_RESPONSES_API_STORE): read back and continued through the router.
    assert client.responses.retrieve(first.id).id == first.id
    follow = client.responses.create(
        model="toy", input="and then?", previous_response_id=first.id, max_output_tokens=2
    )
    assert follow.usage is not None and follow.usage.input_tokens > first.usage.input_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_never_made")


def test_anthropic_messages_render_as_vllm_renders_them(setup: Setup) -> None:
    content = [{"type": "text", "text": "hello"}]
    body = {"model": "toy", "max_tokens": 3, "system": "be brief",
            "messages": [{"role": "user", "content": content}]}  # fmt: skip
    with httpx.Client(base_url=setup.native_url, timeout=120) as http:
        answer = http.post("/v1/messages", json=body)
        assert answer.status_code == 200, answer.text
        message = answer.json()
        assert message["type"] == "message" and message["content"][0]["type"] == "text"
        streamed = http.post("/v1/messages", json={**body, "stream": True})
        assert streamed.status_code == 200 and "event: message_stop" in streamed.text
        counted = http.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]
        # The conversation the router renders for routing is the one vLLM computes.
        routed = parse_request("messages", json.dumps(body).encode(), {}).messages
        tokenized = http.post("/tokenize", json={"model": "toy", "messages": routed}).json()
    assert message["usage"]["input_tokens"] == counted == tokenized["count"]


def test_tokenize_and_detokenize(setup: Setup) -> None:
    with httpx.Client(base_url=setup.prodstack_url, timeout=60) as http:
        tokens = http.post("/tokenize", json={"model": "toy", "prompt": "the cache"}).json()
        text = http.post("/detokenize", json={"model": "toy", "tokens": tokens["tokens"]})
        missing = http.post("/detokenize", json={"model": "toy"})
    assert tokens["count"] == len(tokens["tokens"]) > 0
    assert text.status_code == 200 and "cache" in text.json()["prompt"]
    assert missing.status_code == 400
    assert_vllm_error(missing.json(), 400)  # the engine's own error, relayed


def test_both_routers_and_the_lmcache_configured_engine_serve_the_same_answers(
    setup: Setup,
) -> None:
    rng = random.Random(3)
    prompt = [rng.randrange(10, 2000) for _ in range(600)]  # two full 256-token chunks
    body = {"model": "toy", "prompt": prompt, "max_tokens": 6, "temperature": 0,
            "logprobs": 1}  # fmt: skip
    chat = {"model": "toy", "messages": [{"role": "user", "content": "the prefix cache"}],
            "max_tokens": 6, "temperature": 0}  # fmt: skip
    with httpx.Client(timeout=120) as http:

        def ask(url: str, path: str, payload: dict[str, Any]) -> Any:
            response = http.post(url + path, json=payload, headers={"x-user-id": "u1"})
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]

        computed = ask(setup.native_url, "/v1/completions", body)
        vllm_hit = ask(setup.prodstack_url, "/v1/completions", body)  # vLLM's own prefix hit
        hits = metric_total(setup.engine, HITS)
        reset_prefix_cache(setup.engine)  # vLLM forgets; the LMCache-configured tier has it
        kvstack_hit = ask(setup.prodstack_url, "/v1/completions", body)
        assert wait_metric(setup.engine, HITS, hits + 512) >= hits + 512
        ask(setup.native_url, "/v1/chat/completions", chat)  # computed once, then hits:
        chats = [ask(url, "/v1/chat/completions", chat) for url in
                 (setup.native_url, setup.prodstack_url)]  # fmt: skip
    # A cold prefill may differ from a cached one in the last bits; hits are compared with hits.
    assert computed["text"] and len(computed["logprobs"]["tokens"]) == 6
    assert kvstack_hit["text"] == vllm_hit["text"]
    assert kvstack_hit["logprobs"] == vllm_hit["logprobs"]  # a kvstack hit is vLLM's own hit
    assert chats[0]["message"]["content"] == chats[1]["message"]["content"]
    log = setup.engine.log_path.read_text()
    assert "LMCache configuration (from LMCACHE_CONFIG_FILE=" in log
    assert "cpu://?size=0.25GiB" in log


def test_the_live_engines_routes_are_all_in_the_route_table(setup: Setup) -> None:
    """The engine serving now (development routes included) against the router's table: a
    vLLM upgrade that adds a route fails here as well as against the committed schema."""
    live = httpx.get(f"{setup.engine.url}/openapi.json", timeout=30).json()["paths"]
    missing = [
        f"{method.upper()} {path}"
        for path, operations in live.items()
        for method in operations
        if (found := match_route(path)) is None or method.upper() not in found.route.methods
    ]
    assert not missing, missing


@pytest.mark.parametrize("name", sorted(VALIDATION))
def test_the_validation_recording_is_what_vllm_answers(setup: Setup, name: str) -> None:
    """The recording the simulator is held to (``tests/sim/data/vllm_validation.json``)."""
    case = VALIDATION[name]
    response = httpx.post(setup.engine.url + case["path"], json=case["body"], timeout=60)
    assert response.status_code == case["status"], response.text
    if case["status"] != 200:
        body = response.json()
        assert_vllm_error(body, case["status"])
        assert body["error"]["type"] == case["type"]
        if "param" in case:
            assert body["error"]["param"] == case["param"]
