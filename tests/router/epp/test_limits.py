"""The EPP under overload, on a silent stream and on its own failure: bounded, clear answers."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from tests.router.conftest import engines
from tests.router.epp.conftest import serve_epp
from tests.router.epp.envoy import _headers
from tests.router.fake_engine import FakeEngine

CHAT = {"model": "toy", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
HEADERS = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}


async def _until(predicate: object, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_past_the_bound_a_stream_is_refused_at_once_and_a_pick_frees_it() -> None:
    async with (
        engines(FakeEngine("a")) as [a],
        serve_epp([a], {"max_pending_decisions": 1}) as epp,
    ):
        gate = epp.server.service.gate
        waiting = epp.envoy.stub.Process()  # headers sent, body not yet: waiting for its pick
        await waiting.write(pb.ProcessingRequest(request_headers=pb.HttpHeaders(
            headers=_headers(HEADERS).headers)))  # fmt: skip
        await _until(lambda: gate.pending == 1)
        refused = epp.envoy.stub.Process()
        assert await asyncio.wait_for(refused.code(), 5) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_pending_decisions" in await refused.details()
        body = json.dumps(CHAT).encode()
        await waiting.write(
            pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
        )
        first = await waiting.read()
        assert first.request_headers.response.header_mutation.set_headers  # the pick
        assert gate.pending == 0  # freed at the pick, though the stream goes on
        answer = await epp.envoy.pick("/v1/chat/completions", CHAT)
        assert answer.endpoint == epp.endpoint(a)
        waiting.cancel()
        abandoned = epp.envoy.stub.Process()  # a stream that ends before its pick frees it too
        await abandoned.write(pb.ProcessingRequest(request_headers=pb.HttpHeaders(
            headers=_headers(HEADERS).headers)))  # fmt: skip
        await _until(lambda: gate.pending == 1)
        abandoned.cancel()
        await _until(lambda: gate.pending == 0)


async def test_a_failure_inside_the_picker_is_a_500_answer_not_a_grpc_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with engines(FakeEngine("a")) as [a], serve_epp([a]) as epp:

        async def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(epp.server.picker, "place", broken)
        answer = await epp.envoy.pick("/v1/chat/completions", CHAT)
        assert answer.status == 500 and answer.headers["x-kvstack-error"] == "epp_internal"
        monkeypatch.undo()
        assert (await epp.envoy.pick("/v1/chat/completions", CHAT)).endpoint == epp.endpoint(a)
        assert epp.server.service.gate.pending == 0


async def test_a_silent_stream_is_closed_and_its_request_released() -> None:
    async with engines(FakeEngine("a")) as [a], serve_epp([a], {"idle_timeout_s": 0.6}) as epp:
        state = epp.server.router.pool.states()[0]
        async with epp.envoy.stream() as s:
            await s.send_request("/v1/chat/completions", {**CHAT, "stream": True})
            assert state.in_flight == 1
            headers = _headers({":status": "200", "content-type": "text/event-stream"})
            await s.call.write(pb.ProcessingRequest(response_headers=headers))
            await s.call.read()
            for _ in range(4):  # tokens 0.2 s apart keep a stream open past the timeout
                await asyncio.sleep(0.2)
                chunk = pb.HttpBody(body=b'data: {"choices": []}\n\n')
                await s.call.write(pb.ProcessingRequest(response_body=chunk))
                await s.call.read()
            assert state.in_flight == 1
            code = await asyncio.wait_for(s.call.code(), 5)  # then silence: closed
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "idle_timeout_s" in await s.call.details()
        await _until(lambda: state.in_flight == 0)
