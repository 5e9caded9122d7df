"""The EPP in front of a real vLLM CPU engine: the Envoy double forwards each request where the
EPP said, with its body rewrite, and streams vLLM's answer back through the response side."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kvstack.stack.ports import free_port
from kvstack.stack.vllm_server import VLLMServer, VLLMServerSpec
from tests.router.conftest import until
from tests.router.epp.conftest import serve_epp

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def engine(toy_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    logs = tmp_path_factory.mktemp("epp-vllm")
    spec = VLLMServerSpec(
        model=str(toy_model),
        port=free_port(),
        max_model_len=2048,
        extra_args=["--served-model-name", "toy", "toy-v2"],
    )
    server = VLLMServer(spec, logs / "vllm.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_real_engine_answers_where_the_epp_sent_it(engine: VLLMServer) -> None:
    # vLLM serves the model as "toy" and "toy-v2" (it answers with its first name).
    route = {"name": "toy-canary", "targets": [{"model": "toy-v2"}]}
    async with (
        serve_epp([engine.url], models=[route]) as epp,
        httpx.AsyncClient(timeout=60) as http,
    ):
        state = epp.server.router.pool.states()[0]
        await until(lambda: "toy-v2" in state.models, 30)
        endpoint = engine.url.removeprefix("http://")

        body = {"model": "toy", "prompt": "the cache", "max_tokens": 4}
        done = await epp.envoy.forward("/v1/completions", body, http)
        assert done.status == 200 and done.answer.endpoint == endpoint
        answer = json.loads(done.body)
        assert answer["usage"]["completion_tokens"] == 4

        chat = {"model": "toy-canary", "stream": True, "max_tokens": 5,
                "messages": [{"role": "user", "content": "hello"}]}  # fmt: skip
        done = await epp.envoy.forward("/v1/chat/completions", chat, http)
        assert done.status == 200, done.body
        assert done.answer.json["model"] == "toy-v2"  # rewritten for the canary target
        events = [e[6:] for e in done.body.split(b"\n\n") if e.startswith(b"data: {")]
        assert json.loads(events[0])["choices"]  # vLLM accepted the rewritten name and streamed
        assert done.body.rstrip().endswith(b"data: [DONE]")
        assert (state.in_flight, state.pending) == (0, 0)  # the lease followed the answer
        assert state.ejection.failures == 0
