"""The Endpoint Picker Protocol on Envoy's ext_proc messages: what is read, what is answered.

Names and shapes follow the protocol document of the Gateway API Inference Extension
(``docs/proposals/004-endpoint-picker-protocol``, protocol v1.0.0, as GIE v1.6.0 documents it):

- the subset hint, read from ``metadata_context.filter_metadata["envoy.lb.subset_hint"]
  ["x-gateway-destination-endpoint-subset"]`` (a list of ``ip:port``);
- the destination, answered both as the ``x-gateway-destination-endpoint`` request header and
  as ``dynamic_metadata["envoy.lb"]["x-gateway-destination-endpoint"]`` (same value);
- the endpoint that served, read from ``metadata_context.filter_metadata["envoy.lb"]
  ["x-gateway-destination-endpoint-served"]`` on the response path;
- refusals as an ``ImmediateResponse``: 429 for a shed request, 503 when no endpoint is
  ready (or none of the subset is eligible).

Every builder here returns one ``ProcessingResponse``; nothing here keeps state.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from kvstack.errors import RequestError
from kvstack.router.http.responses import ERROR_HEADER, error_body

__all__ = [
    "DESTINATION_KEY",
    "LB_NAMESPACE",
    "SERVED_KEY",
    "SUBSET_KEY",
    "SUBSET_NAMESPACE",
    "body_chunks",
    "continue_body",
    "continue_headers",
    "continue_trailers",
    "endpoint_of",
    "header_map",
    "header_mutation",
    "immediate",
    "immediate_error",
    "picked_metadata",
    "served_endpoint",
    "subset_hint",
]

SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
DESTINATION_KEY = "x-gateway-destination-endpoint"
SERVED_KEY = "x-gateway-destination-endpoint-served"
# The largest body chunk sent back in one message (GIE's EPP uses 62 KiB, under gRPC's and
# Envoy's per-message buffers).
CHUNK_BYTES = 62 * 1024
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


@functools.lru_cache(maxsize=4096)
def endpoint_of(url: str) -> str:
    """A backend URL's ``ip:port`` (``[v6]:port`` for IPv6), as the protocol names endpoints."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def header_map(headers: ext_proc.HttpHeaders) -> dict[str, str]:
    """The HTTP headers Envoy sent, lowercased; ``raw_value`` (newer Envoys) wins over
    ``value``; a repeated header keeps its last value."""
    out: dict[str, str] = {}
    for header in headers.headers.headers:
        value = header.raw_value.decode("latin-1") if header.raw_value else header.value
        out[header.key.lower()] = value
    return out


def subset_hint(request: ext_proc.ProcessingRequest) -> list[str] | None:
    """The endpoints the proxy allows (None: no hint, the whole pool)."""
    metadata = request.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in metadata:
        return None
    fields = metadata[SUBSET_NAMESPACE].fields
    if SUBSET_KEY not in fields:
        return None
    value = fields[SUBSET_KEY]
    if value.WhichOneof("kind") == "list_value":
        return [v.string_value for v in value.list_value.values if v.string_value]
    if value.WhichOneof("kind") == "string_value":  # tolerate "ip:port,ip:port"
        return [s.strip() for s in value.string_value.split(",") if s.strip()]
    return []


def served_endpoint(request: ext_proc.ProcessingRequest) -> str | None:
    """The endpoint the proxy reports having served the response, if it says."""
    metadata = request.metadata_context.filter_metadata
    if LB_NAMESPACE not in metadata:
        return None
    value = metadata[LB_NAMESPACE].fields.get(SERVED_KEY)
    return value.string_value or None if value is not None else None


def picked_metadata(endpoint: str) -> struct_pb2.Struct:
    """``{"envoy.lb": {"x-gateway-destination-endpoint": endpoint}}``."""
    metadata = struct_pb2.Struct()
    metadata.get_or_create_struct(LB_NAMESPACE)[DESTINATION_KEY] = endpoint
    return metadata


Headers = Mapping[str, str] | Iterable[tuple[str, str]]


def header_mutation(
    set_headers: Headers = (), remove: Sequence[str] = ()
) -> ext_proc.HeaderMutation:
    mutation = ext_proc.HeaderMutation()
    _fill_mutation(mutation, set_headers, remove)
    return mutation


def _fill_mutation(
    target: ext_proc.HeaderMutation, set_headers: Headers, remove: Sequence[str]
) -> None:
    """Headers set (overwriting) and removed, written into ``target`` in place: every answer is
    built where it is sent, not assembled from parts and copied (a third of its cost)."""
    pairs = set_headers.items() if isinstance(set_headers, Mapping) else set_headers
    options = target.set_headers
    for key, value in pairs:
        option = options.add()
        option.header.key = key
        option.header.raw_value = value.encode("latin-1", "replace")
        option.append_action = _OVERWRITE
    if remove:
        target.remove_headers.extend(remove)


def _common(
    common: ext_proc.CommonResponse,
    set_headers: Headers,
    remove: Sequence[str],
    clear_route_cache: bool,
) -> None:
    common.SetInParent()  # an empty CommonResponse is CONTINUE
    if set_headers or remove:
        _fill_mutation(common.header_mutation, set_headers, remove)
    if clear_route_cache:
        common.clear_route_cache = True


def continue_headers(
    phase: str,
    set_headers: Headers = (),
    remove: Sequence[str] = (),
    endpoint: str | None = None,
    clear_route_cache: bool = False,
) -> ext_proc.ProcessingResponse:
    """The answer to ``request_headers`` or ``response_headers`` (``phase``); ``endpoint``: the
    pick, also set as the ``envoy.lb`` metadata."""
    response = ext_proc.ProcessingResponse()
    phase_answer = getattr(response, phase)
    _common(phase_answer.response, set_headers, remove, clear_route_cache)
    if endpoint is not None:
        response.dynamic_metadata.get_or_create_struct(LB_NAMESPACE)[DESTINATION_KEY] = endpoint
    return response


def continue_body(
    phase: str,
    set_headers: Headers = (),
    remove: Sequence[str] = (),
    body: bytes | None = None,
    endpoint: str | None = None,
    clear_route_cache: bool = False,
) -> ext_proc.ProcessingResponse:
    """The answer to a buffered ``request_body`` or ``response_body`` (``phase``): headers may
    still change (buffered mode only), ``body`` replaces the body when given."""
    response = ext_proc.ProcessingResponse()
    common = getattr(response, phase).response
    _common(common, set_headers, remove, clear_route_cache)
    if body is not None:
        common.body_mutation.body = body
    if endpoint is not None:
        response.dynamic_metadata.get_or_create_struct(LB_NAMESPACE)[DESTINATION_KEY] = endpoint
    return response


def body_chunks(phase: str, body: bytes, end_of_stream: bool) -> list[ext_proc.ProcessingResponse]:
    """A body sent back in full-duplex mode: ``streamed_response`` chunks, the last one
    carrying ``end_of_stream`` when the body ends here (an empty body is one empty chunk)."""
    if len(body) <= CHUNK_BYTES:  # the common case (every streamed token): no slicing
        return [_streamed(phase, body, end_of_stream)]
    last = (len(body) - 1) // CHUNK_BYTES * CHUNK_BYTES
    return [
        _streamed(phase, body[i : i + CHUNK_BYTES], end_of_stream and i == last)
        for i in range(0, len(body), CHUNK_BYTES)
    ]


def _streamed(phase: str, piece: bytes, end_of_stream: bool) -> ext_proc.ProcessingResponse:
    response = ext_proc.ProcessingResponse()
    streamed = getattr(response, phase).response.body_mutation.streamed_response
    streamed.body = piece
    streamed.end_of_stream = end_of_stream
    return response


def continue_trailers(phase: str) -> ext_proc.ProcessingResponse:
    response = ext_proc.ProcessingResponse()
    getattr(response, phase).CopyFrom(ext_proc.TrailersResponse())
    return response


def immediate(
    status: int, body: bytes, headers: Mapping[str, str] | None = None, details: str = ""
) -> ext_proc.ProcessingResponse:
    """Answer the client now, without an upstream (a refusal)."""
    answer = ext_proc.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),
        headers=header_mutation({"content-type": "application/json", **(headers or {})}),
        body=body,
        details=details,
    )
    return ext_proc.ProcessingResponse(immediate_response=answer)


def immediate_error(error: RequestError, details: str) -> ext_proc.ProcessingResponse:
    """vLLM's error body with the error's status, the router's reason in ``x-kvstack-error``
    as the router's own answers carry it (``Retry-After`` when it has one)."""
    headers: dict[str, Any] = {}
    if error.code is not None:
        headers[ERROR_HEADER.decode()] = error.code
    if error.retry_after_s is not None:
        headers["retry-after"] = str(max(1, math.ceil(error.retry_after_s)))
    return immediate(error.status, error_body(error), headers, details)
