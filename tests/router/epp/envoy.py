"""An Envoy double for the ext_proc protocol, built from the published Envoy protos (xds-protos).

It sends the message sequences Envoy's ext_proc filter sends (``ext_proc.proto``,
``processing_mode.proto``) for one HTTP request:

- request, ``FULL_DUPLEX_STREAMED``: ``request_headers`` (with ``protocol_config`` on the first
  message), then every body chunk without waiting; it then reads the headers answer and body
  answers until one carries ``streamed_response.end_of_stream``.
- request, ``BUFFERED``: ``request_headers``, wait for the answer; the whole body in one
  ``request_body`` (``end_of_stream``), wait for the answer.
- response: ``response_headers`` (``:status``), then body chunks; full duplex reads the echoed
  chunks, streamed/buffered read one answer per chunk.

``forward`` then plays the data plane: it sends the request to the endpoint the EPP picked,
with the EPP's header and body mutations, and streams the answer back through the response side.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

MODES = processing_mode_pb2.ProcessingMode.BodySendMode
FULL_DUPLEX, BUFFERED, STREAMED = MODES.FULL_DUPLEX_STREAMED, MODES.BUFFERED, MODES.STREAMED


@dataclass
class Answer:
    """What the EPP told the data plane for the request side."""

    status: int | None = None  # an immediate response's status
    body: bytes = b""  # the immediate response's body, else the body to send upstream
    headers: dict[str, str] = field(default_factory=dict)  # set on the request (or immediate)
    removed: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)  # dynamic metadata
    clear_route_cache: bool = False
    messages: int = 0

    @property
    def endpoint(self) -> str | None:
        return self.headers.get("x-gateway-destination-endpoint")

    @property
    def json(self) -> Any:
        return json.loads(self.body)


def _headers(pairs: Mapping[str, str]) -> pb.HttpHeaders:
    values = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values))


def _subset_metadata(subset: Sequence[str] | None) -> base_pb2.Metadata:
    metadata = base_pb2.Metadata()
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.get_or_create_list("x-gateway-destination-endpoint-subset").extend(list(subset))
        metadata.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    return metadata


def _mutation(answer: Answer, mutation: pb.HeaderMutation) -> None:
    for option in mutation.set_headers:
        value = option.header.raw_value.decode() or option.header.value
        answer.headers[option.header.key.lower()] = value
    answer.removed.extend(mutation.remove_headers)


@dataclass
class Forwarded:
    answer: Answer  # the request side
    status: int  # the client's status
    body: bytes  # the client's body
    headers: dict[str, str]  # what the EPP added to the client's answer


class ExtProcCall:
    """One HTTP request's ext_proc stream, driven like Envoy drives it."""

    def __init__(self, call: Any, request_mode: int, response_mode: int) -> None:
        self.call = call
        self.request_mode = request_mode
        self.response_mode = response_mode
        self.first = True
        self.answer = Answer()

    def _message(self, **fields: Any) -> pb.ProcessingRequest:
        message = pb.ProcessingRequest(**fields)
        if self.first:
            message.protocol_config.request_body_mode = self.request_mode  # type: ignore[assignment]
            message.protocol_config.response_body_mode = self.response_mode  # type: ignore[assignment]
            self.first = False
        return message

    async def _read(self) -> pb.ProcessingResponse:
        response = await self.call.read()
        assert response is not grpc.aio.EOF, "the EPP closed the stream"
        self.answer.messages += 1
        if response.HasField("dynamic_metadata"):
            from google.protobuf.json_format import MessageToDict

            self.answer.metadata.update(MessageToDict(response.dynamic_metadata))
        if response.HasField("immediate_response"):
            immediate = response.immediate_response
            self.answer.status = immediate.status.code
            self.answer.body = immediate.body
            _mutation(self.answer, immediate.headers)
        return response

    async def send_request(
        self,
        path: str,
        body: bytes | Mapping[str, Any] | None,
        headers: Mapping[str, str] | None = None,
        subset: Sequence[str] | None = None,
        chunk_bytes: int = 1 << 20,
    ) -> Answer:
        raw = json.dumps(body).encode() if isinstance(body, Mapping) else body
        pairs = {":method": "POST" if raw is not None else "GET", ":path": path,
                 ":authority": "gateway", ":scheme": "http", **(headers or {})}  # fmt: skip
        if raw is not None:
            pairs.setdefault("content-type", "application/json")
            pairs.setdefault("content-length", str(len(raw)))
        await self.call.write(
            self._message(
                request_headers=pb.HttpHeaders(
                    headers=_headers(pairs).headers, end_of_stream=raw is None
                ),
                metadata_context=_subset_metadata(subset),
            )
        )
        if raw is None or self.request_mode == BUFFERED:
            response = await self._read()
            if response.HasField("immediate_response"):
                return self.answer
            self._common(response.request_headers.response)
            if raw is None:
                return self.answer
        chunks = [raw[i : i + chunk_bytes] for i in range(0, len(raw), chunk_bytes)] or [b""]
        if self.request_mode == BUFFERED:
            chunks = [raw]
        for i, chunk in enumerate(chunks):
            eos = i == len(chunks) - 1
            await self.call.write(
                self._message(request_body=pb.HttpBody(body=chunk, end_of_stream=eos))
            )
        return await self._request_answers(raw)

    async def _request_answers(self, raw: bytes) -> Answer:
        if self.request_mode == BUFFERED:
            response = await self._read()
            if not response.HasField("immediate_response"):
                common = response.request_body.response
                self._common(common)
                body = common.body_mutation
                self.answer.body = body.body if body.WhichOneof("mutation") == "body" else raw
            return self.answer
        response = await self._read()  # the headers answer, after the whole body
        if response.HasField("immediate_response"):
            return self.answer
        assert response.HasField("request_headers"), response
        self._common(response.request_headers.response)
        upstream = b""
        while True:
            response = await self._read()
            streamed = response.request_body.response.body_mutation.streamed_response
            upstream += streamed.body
            if streamed.end_of_stream:
                break
        self.answer.body = upstream
        return self.answer

    def _common(self, common: pb.CommonResponse) -> None:
        _mutation(self.answer, common.header_mutation)
        self.answer.clear_route_cache |= common.clear_route_cache

    async def send_response(
        self,
        status: int,
        chunks: Sequence[bytes],
        content_type: str = "application/json",
        served: str | None = None,
    ) -> tuple[dict[str, str], bytes]:
        """The answer's headers and chunks through the EPP: (headers it added, body echoed)."""
        metadata = base_pb2.Metadata()
        if served:
            metadata.filter_metadata["envoy.lb"].update(
                {"x-gateway-destination-endpoint-served": served}
            )
        headers = _headers({":status": str(status), "content-type": content_type})
        await self.call.write(self._message(response_headers=headers, metadata_context=metadata))
        added = Answer()
        response = await self._read()
        _mutation(added, response.response_headers.response.header_mutation)
        echoed = b""
        pieces = list(chunks) or [b""]
        if self.response_mode == BUFFERED:
            pieces = [b"".join(pieces)]
        for i, chunk in enumerate(pieces):
            eos = i == len(pieces) - 1
            await self.call.write(
                self._message(response_body=pb.HttpBody(body=chunk, end_of_stream=eos))
            )
            response = await self._read()
            common = response.response_body.response
            if self.response_mode == FULL_DUPLEX:
                echoed += common.body_mutation.streamed_response.body
            else:
                echoed += chunk
        return added.headers, echoed


class EnvoyDouble:
    def __init__(
        self,
        target: str,
        credentials: grpc.ChannelCredentials | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.target = target
        self.metadata = tuple(metadata)
        if credentials is None:
            self.channel = grpc.aio.insecure_channel(target, options=list(options))
        else:
            self.channel = grpc.aio.secure_channel(target, credentials, options=list(options))
        self.stub = pb_grpc.ExternalProcessorStub(self.channel)

    @asynccontextmanager
    async def stream(
        self, request_mode: int = FULL_DUPLEX, response_mode: int = FULL_DUPLEX
    ) -> AsyncIterator[ExtProcCall]:
        call = self.stub.Process(metadata=self.metadata or None)
        try:
            yield ExtProcCall(call, request_mode, response_mode)
        finally:
            await call.done_writing()
            call.cancel()

    async def pick(self, path: str, body: Any, **kwargs: Any) -> Answer:
        """Only the request side, then the stream ends (the request is finished as cancelled)."""
        modes = {k: kwargs.pop(k) for k in ("request_mode", "response_mode") if k in kwargs}
        async with self.stream(**modes) as s:
            return await s.send_request(path, body, **kwargs)

    async def forward(
        self, path: str, body: Mapping[str, Any], http: httpx.AsyncClient, **kwargs: Any
    ) -> Forwarded:
        """The whole request as the data plane runs it: ask, send where told, answer back."""
        modes = {k: kwargs.pop(k) for k in ("request_mode", "response_mode") if k in kwargs}
        async with self.stream(**modes) as s:
            answer = await s.send_request(path, body, **kwargs)
            if answer.status is not None:
                return Forwarded(answer, answer.status, answer.body, answer.headers)
            headers = {k: v for k, v in answer.headers.items() if not k.startswith("x-gateway")}
            headers.setdefault("content-type", "application/json")
            url = f"http://{answer.endpoint}{path}"
            async with http.stream("POST", url, content=answer.body, headers=headers) as upstream:
                chunks = [c async for c in upstream.aiter_raw()]
                content_type = upstream.headers.get("content-type", "application/json")
                added, _ = await s.send_response(
                    upstream.status_code, chunks, content_type, answer.endpoint
                )
                return Forwarded(answer, upstream.status_code, b"".join(chunks), added)

    async def close(self) -> None:
        await self.channel.close()
