"""The load generator of ``kvstack bench epp``: Envoy's full-duplex ext_proc sequence per request,
timed; and the reference arm, a null ext_proc server on the same grpc.aio stack.

Per request (one gRPC stream, as Envoy's ext_proc filter in FULL_DUPLEX_STREAMED mode):
``request_headers`` and the body (``end_of_stream``) written at once; the **decision latency**
runs from the body written to the headers answer read (the pick: until then Envoy holds the
request); then the streamed body answer, ``response_headers`` and one ``response_body`` chunk
(``end_of_stream``) with their answers, so the EPP's load accounting sees every request end.
The **response latency** is the time of those two response round trips.

``python -m kvstack.bench.micro.epp_load --null-server PORT`` runs the null server: it answers
every message as the EPP's protocol requires (a fixed destination), with no decision at all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

__all__ = ["ExtProcLoad", "closed_loop", "open_loop", "serve_null"]

FULL_DUPLEX = processing_mode_pb2.ProcessingMode.BodySendMode.FULL_DUPLEX_STREAMED
RESPONSE = b'{"id":"x","object":"text_completion","model":"sim-model","choices":[]}'


@dataclass
class ExtProcLoad:
    decision_s: list[float] = field(default_factory=list)
    response_s: list[float] = field(default_factory=list)
    endpoints: list[tuple[int, str]] = field(default_factory=list)  # (group, endpoint)
    error_kinds: Counter[str] = field(default_factory=Counter)  # "503", "grpc:UNAVAILABLE", ...
    elapsed_s: float = 0.0

    @property
    def errors(self) -> int:
        return sum(self.error_kinds.values())

    @property
    def done(self) -> int:
        return len(self.decision_s)


def _headers(pairs: dict[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    )


def request_messages(body: bytes) -> tuple[pb.ProcessingRequest, pb.ProcessingRequest]:
    headers = {":method": "POST", ":path": "/v1/completions", ":authority": "gateway",
               "content-type": "application/json", "content-length": str(len(body))}  # fmt: skip
    first = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=_headers(headers)))
    first.protocol_config.request_body_mode = FULL_DUPLEX
    first.protocol_config.response_body_mode = FULL_DUPLEX
    return first, pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))


_RESPONSE_HEADERS = pb.ProcessingRequest(
    response_headers=pb.HttpHeaders(
        headers=_headers({":status": "200", "content-type": "application/json"})
    )
)
_RESPONSE_BODY = pb.ProcessingRequest(response_body=pb.HttpBody(body=RESPONSE, end_of_stream=True))


async def one_request(stub: Any, body: bytes, group: int, result: ExtProcLoad) -> None:
    call = stub.Process()
    try:
        first, rest = request_messages(body)
        await call.write(first)
        await call.write(rest)
        sent = time.perf_counter()
        answer = await call.read()
        picked = time.perf_counter()
        if answer is grpc.aio.EOF:
            result.error_kinds["eof"] += 1
            return
        if answer.HasField("immediate_response"):
            result.error_kinds[str(answer.immediate_response.status.code)] += 1
            return
        await call.read()  # the body, streamed back
        started = time.perf_counter()
        await call.write(_RESPONSE_HEADERS)
        await call.read()
        await call.write(_RESPONSE_BODY)
        await call.read()
        result.response_s.append(time.perf_counter() - started)
        result.decision_s.append(picked - sent)
        for option in answer.request_headers.response.header_mutation.set_headers:
            if option.header.key == "x-gateway-destination-endpoint":
                result.endpoints.append((group, option.header.raw_value.decode()))
        await call.done_writing()
    except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
        # Classified by the call's final status, not by the write or read that failed: a
        # server that ends a call early (RESOURCE_EXHAUSTED when it sheds) makes the client's
        # next write raise INTERNAL or InvalidStateError, which would hide why it ended.
        result.error_kinds[f"grpc:{(await call.code()).name}"] += 1
    finally:
        call.cancel()


async def open_loop(
    target: str, bodies: Sequence[tuple[int, bytes]], rate: float, duration_s: float, seed: int
) -> ExtProcLoad:
    """Poisson arrivals at ``rate`` req/s for ``duration_s``; each request its own task."""
    rng, result = random.Random(seed), ExtProcLoad()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        await _warm(stub, bodies)
        tasks: set[asyncio.Task[None]] = set()
        start = time.perf_counter()
        due, i = start, 0
        while due - start < duration_s:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            group, body = bodies[i % len(bodies)]
            task = asyncio.create_task(one_request(stub, body, group, result))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
            due += rng.expovariate(rate)
        await asyncio.gather(*tasks)
        result.elapsed_s = time.perf_counter() - start
    return result


async def closed_loop(
    target: str, bodies: Sequence[tuple[int, bytes]], concurrency: int, duration_s: float
) -> ExtProcLoad:
    """``concurrency`` streams back to back for ``duration_s``: the most decisions per second."""
    result = ExtProcLoad()
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        await _warm(stub, bodies)
        start = time.perf_counter()

        async def worker(offset: int) -> None:
            i = offset
            while time.perf_counter() - start < duration_s:
                group, body = bodies[i % len(bodies)]
                await one_request(stub, body, group, result)
                i += concurrency

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        result.elapsed_s = time.perf_counter() - start
    return result


async def _warm(stub: Any, bodies: Sequence[tuple[int, bytes]]) -> None:
    scratch = ExtProcLoad()
    for group, body in bodies[:20]:
        await one_request(stub, body, group, scratch)


# -- the null reference server ------------------------------------------------------------
class NullProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """The protocol's answers with a fixed destination: what transport alone costs."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        body = b""
        async for message in request_iterator:
            kind = message.WhichOneof("request")
            if kind == "request_body":
                body += message.request_body.body
                if message.request_body.end_of_stream:
                    yield self._headers()
                    common = pb.CommonResponse()
                    common.body_mutation.streamed_response.body = body
                    common.body_mutation.streamed_response.end_of_stream = True
                    yield pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
            elif kind == "response_headers":
                yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())
            elif kind == "response_body":
                common = pb.CommonResponse()
                common.body_mutation.streamed_response.body = message.response_body.body
                common.body_mutation.streamed_response.end_of_stream = (
                    message.response_body.end_of_stream
                )
                yield pb.ProcessingResponse(response_body=pb.BodyResponse(response=common))

    def _headers(self) -> pb.ProcessingResponse:
        option = base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(
                key="x-gateway-destination-endpoint", raw_value=self.endpoint.encode()
            )
        )
        common = pb.CommonResponse(
            header_mutation=pb.HeaderMutation(set_headers=[option]), clear_route_cache=True
        )
        response = pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common))
        response.dynamic_metadata.get_or_create_struct("envoy.lb")[
            "x-gateway-destination-endpoint"
        ] = self.endpoint
        return response


async def serve_null(port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(NullProcessor("127.0.0.1:8000"), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(json.dumps({"listening": port}), flush=True)
    await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--null-server", type=int, required=True, metavar="PORT")
    asyncio.run(serve_null(parser.parse_args().null_server))


if __name__ == "__main__":
    main()
