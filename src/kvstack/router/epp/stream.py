"""``ExtProcStream``: one HTTP request's ext_proc conversation with Envoy, message by message.

The request side, in the two body modes that can carry a pick made from the body:

- ``FULL_DUPLEX_STREAMED`` (what GIE gateways configure): Envoy sends the headers and every body
  chunk without waiting. At the chunk with ``end_of_stream`` (or the trailers) the EPP decides
  and answers, in this order, the headers (destination header, ``content-length`` when the body
  changed, ``clear_route_cache``, the ``envoy.lb`` metadata) and the body as
  ``streamed_response`` chunks, the last with ``end_of_stream``.
- ``BUFFERED``: Envoy waits for the headers answer (a plain continue), then sends the whole
  body; the body answer carries the header mutation (allowed in buffered mode), the body when
  it changed and the metadata.

``STREAMED`` (half duplex) sends the headers upstream before any body is seen, so no pick
made from the body could reach the router filter: the EPP refuses it with a 500 that says so.
The mode is what Envoy's ``protocol_config`` says, else ``epp.request_body_mode``.

The response side observes: the status at the response headers (a 5xx counts against the
backend), the first body bytes (first token: the load lease's prefill share comes back, TTFT
is learnt, the adapter manager hears which model answered), the end of the body (the request
is finished). Chunks are echoed back in full-duplex mode, continued otherwise. A stream that
ends early (the client left, Envoy reset) finishes the request as ``cancelled``.
"""

from __future__ import annotations

import logging
import time

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from kvstack.errors import NoBackendError, RequestError
from kvstack.metrics import counter, histogram
from kvstack.router.epp import protocol
from kvstack.router.epp.picker import EndpointPicker, Placement

__all__ = ["ExtProcStream"]

log = logging.getLogger(__name__)
Responses = list[ext_proc.ProcessingResponse]
_MODES = processing_mode_pb2.ProcessingMode.BodySendMode
_MODE_NAMES = {
    "none": _MODES.NONE,
    "streamed": _MODES.STREAMED,
    "buffered": _MODES.BUFFERED,
    "full_duplex_streamed": _MODES.FULL_DUPLEX_STREAMED,
}
DECISION = histogram(
    "kvstack_epp_decision_seconds",
    "From the request's last ext_proc message to the EPP's answer (the pick)",
)
ANSWERS = counter(
    "kvstack_epp_answers_total", "Requests answered by the EPP, by result", ["result"]
)


PICKED = ANSWERS.labels("picked")


def _request_headers(placement: Placement) -> dict[str, str]:
    return {protocol.DESTINATION_KEY: placement.endpoint, **placement.set_headers}


class ExtProcStream:
    def __init__(self, picker: EndpointPicker, request_mode: str, response_mode: str) -> None:
        self.picker = picker
        self.request_mode = _MODE_NAMES[request_mode]
        self.response_mode = _MODE_NAMES[response_mode]
        self.done = False  # an immediate response ended the conversation
        self.placement: Placement | None = None
        self._headers: dict[str, str] = {}
        self._subset: list[str] | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._arrival_s = 0.0
        self._status = 0
        self._finished = False

    async def handle(self, message: ext_proc.ProcessingRequest) -> Responses:
        """The answers to one message from Envoy (none while a full-duplex body streams in)."""
        if message.HasField("protocol_config"):
            self.request_mode = message.protocol_config.request_body_mode
            self.response_mode = message.protocol_config.response_body_mode
        kind = message.WhichOneof("request")
        try:
            responses = await self._dispatch(kind, message)
        except RequestError as exc:
            responses = self._refuse(exc, exc.status)
        except NoBackendError as exc:
            error = RequestError(str(exc), 503, code="no_backend")
            responses = self._refuse(error, 503)
        except Exception:  # the request's boundary: a bug answers this request, not the stream
            log.exception("the endpoint picker failed on a %s message", kind)
            responses = self._failed(kind, message)
        return [] if message.observability_mode else responses

    def close(self) -> None:
        """The stream ended (Envoy closed it, or the client left)."""
        if self.placement is not None and not self._finished:
            ended = 0 < self._status < 500 and self.response_mode == _MODES.NONE
            self._finish("ok" if ended else "cancelled")

    # -- request side ----------------------------------------------------------------------
    async def _dispatch(self, kind: str | None, message: ext_proc.ProcessingRequest) -> Responses:
        if kind == "request_headers":
            return self._request_headers(message)
        if kind == "request_body":
            return await self._request_body(message.request_body)
        if kind == "request_trailers":
            responses = await self._end_of_body() if self.placement is None else []
            return [*responses, protocol.continue_trailers("request_trailers")]
        if kind == "response_headers":
            return self._response_headers(message)
        if kind == "response_body":
            return self._response_body(message.response_body)
        if kind == "response_trailers":
            self._finish(self._outcome())
            return [protocol.continue_trailers("response_trailers")]
        raise RequestError(f"unexpected ext_proc message {kind!r}", 500, code="epp_protocol")

    def _request_headers(self, message: ext_proc.ProcessingRequest) -> Responses:
        self._arrival_s = time.perf_counter()
        self._headers = protocol.header_map(message.request_headers)
        self._subset = protocol.subset_hint(message)
        if message.request_headers.end_of_stream:  # no body: GET /v1/models and the like
            self.placement = self.picker.place_bodyless(self._headers, self._subset)
            return [self._pick_headers(self.placement)]
        if self.request_mode == _MODES.STREAMED:
            raise RequestError(
                "the gateway's ext_proc request_body_mode is STREAMED, which forwards the "
                "headers before the body is read; the endpoint picker needs "
                "FULL_DUPLEX_STREAMED or BUFFERED",
                500,
                code="epp_body_mode",
            )
        if self.request_mode == _MODES.FULL_DUPLEX_STREAMED:
            return []  # answered with the pick, once the body is in
        return [protocol.continue_headers("request_headers")]

    async def _request_body(self, body: ext_proc.HttpBody) -> Responses:
        self._size += len(body.body)
        if self._size > self.picker.limit_bytes:
            raise RequestError(
                f"the request body ({self._size} bytes or more) exceeds the limit of "
                f"{self.picker.limit_bytes} bytes",
                413,
                code="request_too_large",
            )
        self._chunks.append(body.body)
        if body.end_of_stream:
            return await self._end_of_body()
        if self.request_mode == _MODES.FULL_DUPLEX_STREAMED:
            return []
        raise RequestError(
            "the gateway sent a partial body (BUFFERED_PARTIAL over its buffer limit); the "
            "endpoint picker needs the whole body",
            413,
            code="request_too_large",
        )

    async def _end_of_body(self) -> Responses:
        raw = b"".join(self._chunks)
        self._chunks = []
        started_s = time.perf_counter()
        placement = await self.picker.place(self._headers, raw, self._subset, self._arrival_s)
        self.placement = placement
        if self.request_mode == _MODES.FULL_DUPLEX_STREAMED:
            responses = [self._pick_headers(placement)]
            responses += protocol.body_chunks("request_body", placement.body, True)
        else:
            body = placement.body if placement.rewritten else None
            responses = [
                protocol.continue_body(
                    "request_body", _request_headers(placement), placement.remove_headers,
                    body, placement.endpoint, True,
                )
            ]  # fmt: skip
        DECISION.observe(time.perf_counter() - started_s)
        PICKED.inc()
        return responses

    def _failed(self, kind: str | None, message: ext_proc.ProcessingRequest) -> Responses:
        """Before the pick: a 500 to the client naming the failure. After it the request is on
        its way: the message passes unchanged and the request is finished as cancelled."""
        if self.placement is None or kind is None or not kind.startswith("response_"):
            error = RequestError(
                "the endpoint picker failed on this request (see its log)", 500,
                code="epp_internal",
            )  # fmt: skip
            return self._refuse(error, 500)
        self._finish("cancelled")
        if kind == "response_body":
            body = message.response_body
            if self.response_mode == _MODES.FULL_DUPLEX_STREAMED:
                return protocol.body_chunks("response_body", body.body, body.end_of_stream)
            return [protocol.continue_body("response_body")]
        if kind == "response_trailers":
            return [protocol.continue_trailers("response_trailers")]
        return [protocol.continue_headers("response_headers")]

    def _pick_headers(self, placement: Placement) -> ext_proc.ProcessingResponse:
        return protocol.continue_headers(
            "request_headers", _request_headers(placement), placement.remove_headers,
            placement.endpoint, clear_route_cache=True,
        )  # fmt: skip

    def _refuse(self, error: RequestError, status: int) -> Responses:
        self.done = True
        ANSWERS.labels(str(status)).inc()
        if self.placement is not None:  # a failure after the pick (response side)
            self._finish("cancelled")
        return [protocol.immediate_error(error, f"kvstack_epp_{error.code or status}")]

    # -- response side ---------------------------------------------------------------------
    def _response_headers(self, message: ext_proc.ProcessingRequest) -> Responses:
        headers = protocol.header_map(message.response_headers)
        self._status = int(headers.get(":status", "0") or 0)
        placement = self.placement
        answer: list[tuple[str, str]] = []
        if placement is not None:
            self._check_served(protocol.served_endpoint(message), placement)
            answer = [(k.decode(), v.decode("latin-1")) for k, v in placement.response_headers]
            flight = placement.flight
            if flight is not None and self.response_mode == _MODES.NONE:
                flight.first_byte(b"", time.perf_counter() - self._arrival_s)  # no body seen
            if message.response_headers.end_of_stream:
                self._finish(self._outcome())
        return [protocol.continue_headers("response_headers", answer)]

    def _response_body(self, body: ext_proc.HttpBody) -> Responses:
        flight = self.placement.flight if self.placement is not None else None
        if flight is not None and body.body and not flight.started:
            flight.first_byte(body.body[:4096], time.perf_counter() - self._arrival_s)
        if body.end_of_stream:
            self._finish(self._outcome())
        if self.response_mode == _MODES.FULL_DUPLEX_STREAMED:
            return protocol.body_chunks("response_body", body.body, body.end_of_stream)
        return [protocol.continue_body("response_body")]

    def _outcome(self) -> str:
        return "status" if self._status >= 500 else "ok"

    def _check_served(self, served: str | None, placement: Placement) -> None:
        if served is not None and served != placement.endpoint:
            log.debug("the proxy served %s, the EPP picked %s", served, placement.endpoint)

    def _finish(self, outcome: str) -> None:
        placement = self.placement
        if placement is None or self._finished:
            return
        self._finished = True
        flight, request = placement.flight, placement.request
        router = self.picker.router
        if flight is not None:
            if outcome == "status" and self._status in router.config.retry.on_status:
                placement.backend.record_failure(router.config.ejection, "status")
                router.telemetry.upstream_error(placement.backend.id, "status")
            flight.finish(outcome)
        if request is not None:
            duration_s = time.perf_counter() - self._arrival_s
            router.telemetry.request(request.model, placement.backend.id, self._status, duration_s)
            answer = request.state.answer
            if request.stream and answer is not None and answer.first_bytes:
                router.telemetry.ttft(request.model, answer.ttft_s)
        placement.close()
