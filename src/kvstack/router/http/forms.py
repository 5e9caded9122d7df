"""The text fields of a ``multipart/form-data`` body (vLLM's audio routes), read and replaced.

The router routes an audio request by its ``model`` field and, like any request, may rewrite
that field (an alias, an adapter version). python-multipart (Starlette's form parser) finds the
parts; a field's value is located by its byte offsets in the body, so replacing it leaves every
other byte (the audio file included) as the client sent it. The body was already bounded by
the router's request size limit before it gets here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from kvstack.errors import RequestError

__all__ = ["FormFields", "form_fields", "replace_form_field"]

MAX_FIELD_BYTES = 4096  # a text field routing reads (model, stream); longer ones are not read


@dataclass(slots=True)
class FormFields:
    """Small text fields by name, and where each value lies in the body."""

    values: dict[str, str] = field(default_factory=dict)
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(slots=True)
class _Part:
    header_field: bytearray = field(default_factory=bytearray)
    header_value: bytearray = field(default_factory=bytearray)
    name: str | None = None
    is_file: bool = False
    start: int = -1
    end: int = -1


def _boundary(content_type: str) -> bytes:
    kind, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise RequestError(
            "a form body must be multipart/form-data with a boundary", param="content-type"
        )
    return boundary


def form_fields(body: bytes, content_type: str) -> FormFields:
    """The body's small text fields (RequestError 400 for a body that is not a form)."""
    found = FormFields()
    part = _Part()

    def on_header_field(data: bytes, start: int, end: int) -> None:
        part.header_field += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        part.header_value += data[start:end]

    def on_header_end() -> None:
        if bytes(part.header_field).lower() == b"content-disposition":
            _, options = parse_options_header(bytes(part.header_value))
            name = options.get(b"name")
            part.name = None if name is None else name.decode("utf-8", "replace")
            part.is_file = b"filename" in options
        part.header_field.clear()
        part.header_value.clear()

    def on_part_data(data: bytes, start: int, end: int) -> None:
        part.start = start if part.start < 0 else part.start
        part.end = end

    def on_part_end() -> None:
        if part.name is not None and not part.is_file and part.name not in found.values:
            if part.start < 0:  # an empty value: nothing to locate
                found.values[part.name] = ""
            elif part.end - part.start <= MAX_FIELD_BYTES:
                found.spans[part.name] = (part.start, part.end)
                found.values[part.name] = body[part.start : part.end].decode("utf-8", "replace")
        part.name, part.is_file, part.start, part.end = None, False, -1, -1

    callbacks = {
        "on_header_field": on_header_field,
        "on_header_value": on_header_value,
        "on_header_end": on_header_end,
        "on_part_data": on_part_data,
        "on_part_end": on_part_end,
    }
    parser = MultipartParser(_boundary(content_type), callbacks)  # type: ignore[arg-type]
    try:
        parser.write(body)  # one write: the offsets the callbacks get are offsets in `body`
        parser.finalize()
    except MultipartParseError as exc:
        raise RequestError(f"the form body cannot be parsed: {exc}", param="body") from None
    return found


def replace_form_field(body: bytes, content_type: str, name: str, value: str) -> bytes:
    """``body`` with the text field ``name`` set to ``value`` (it must be present)."""
    span = form_fields(body, content_type).spans.get(name)
    if span is None:
        raise RequestError(f"the form has no {name!r} field", param=name)
    start, end = span
    return body[:start] + value.encode() + body[end:]
