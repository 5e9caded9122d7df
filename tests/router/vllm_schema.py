"""vLLM's OpenAPI schemas (``tests/router/data``, from ``scripts/vllm-openapi.py``): its routes
and its ``ErrorResponse``, for tests that hold the router and the simulator to them."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from kvstack.router.http.responses import VLLM_ERROR_TYPES

__all__ = ["SCHEMAS", "assert_vllm_error", "schema_routes"]

DATA = Path(__file__).parent / "data"
SCHEMAS = sorted(DATA.glob("vllm-*-openapi.json"))


@cache
def _documents() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(path.read_text()) for path in SCHEMAS)


def schema_routes() -> set[tuple[str, str]]:
    """Every (path, METHOD) any of the schemas publishes."""
    return {
        (path, method.upper())
        for document in _documents()
        for path, operations in document["paths"].items()
        for method in operations
    }


@cache
def _error_validator() -> Draft202012Validator:
    schemas = _documents()[0]["components"]["schemas"]
    wanted = {name: schemas[name] for name in ("ErrorResponse", "ErrorInfo")}
    root = {"$ref": "#/components/schemas/ErrorResponse", "components": {"schemas": wanted}}
    return Draft202012Validator(root)


def assert_vllm_error(body: Any, status: int) -> None:
    """``body`` is vLLM's ``ErrorResponse`` for ``status``: the schema, the integer code, and a
    ``type`` vLLM itself uses."""
    errors = [e.message for e in _error_validator().iter_errors(body)]
    assert not errors, (body, errors)
    error = body["error"]
    assert error["code"] == status, body
    assert error["type"] in VLLM_ERROR_TYPES, body
    assert set(error) == {"message", "type", "param", "code"}, body
