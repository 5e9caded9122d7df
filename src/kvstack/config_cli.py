"""``kvstack config show | reference``: the effective configuration, or its reference table."""

from __future__ import annotations

import argparse
import json
import re
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from kvstack.config import KVStackConfig, load_config
from kvstack.redact import redact_data

__all__ = ["reference_markdown", "run"]


def reference_markdown() -> str:
    """A markdown table of every section and key, generated from the config models."""
    lines = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    _walk(KVStackConfig, "", lines)
    return "\n".join(lines)


def _walk(model: type[BaseModel], prefix: str, lines: list[str]) -> None:
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        nested = _model_of(field.annotation)
        if nested is not None:
            _walk(nested, f"{key}.", lines)
            continue
        default = (
            "required"
            if field.is_required()
            else _show(field.get_default(call_default_factory=True))
        )
        description = (field.description or "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{key}` | {_type_name(field.annotation)} | {default} | {description} |")
        item = _list_item_model(field.annotation)
        if item is not None:
            _walk(item, f"{key}[].", lines)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The config model behind ``Model`` or ``Model | None``; None for plain values."""
    candidates = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
    return models[0] if len(models) == 1 else None


def _list_item_model(annotation: Any) -> type[BaseModel] | None:
    """``Model`` for ``list[Model]`` fields (each item's keys get rows of their own)."""
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
    return None


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _type_name(annotation: Any) -> str:
    text = str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")
    text = re.sub(r"\b(?:[a-z_]+\.)+([A-Z]\w*)", r"\1", text)  # kvstack.x.y.Model -> Model
    return text.replace(" | ", " or ").replace("NoneType", "None")


def _show(value: Any) -> str:
    text = json.dumps(to_jsonable_python(value))
    return f"`{text}`".replace("|", "\\|")


def run(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvstack config", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    show = sub.add_parser("show", help="print the effective configuration as JSON")
    show.add_argument("--config", help="YAML file (default: $KVSTACK_CONFIG)")
    sub.add_parser("reference", help="print the configuration reference as a markdown table")
    args = parser.parse_args(argv)
    if args.action == "show":
        cfg = load_config(args.config)
        shown = redact_data(cfg.model_dump(mode="json"))  # SecretStr is masked by pydantic
        print(json.dumps(shown, indent=2, sort_keys=True))
    else:
        print(reference_markdown())
    return 0
