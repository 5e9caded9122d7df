"""``kvstack config show | reference``: the effective configuration, or its reference table.

``show`` prints the effective tree as YAML, the form a config file takes (secrets masked);
``reference`` prints every key as a markdown table (docs/configuration.md); with
``--connector``, the keys of the vLLM connector's ``kv_connector_extra_config`` instead. With
``--json`` each prints one JSON document instead: the tree, or ``{"keys": [{key, type,
default, description}, ...]}``.
"""

from __future__ import annotations

import argparse
import json
import re
import types
import typing
from typing import Any, NamedTuple

import yaml
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from kvstack.config import KVStackConfig, load_config
from kvstack.output import add_json_flag, print_json
from kvstack.redact import redact_data

__all__ = ["ReferenceRow", "reference_markdown", "reference_rows", "run"]


class ReferenceRow(NamedTuple):
    """One key of the reference; ``default`` is None for a required key."""

    key: str
    type: str
    default: Any
    required: bool
    description: str


def reference_rows(connector: bool = False) -> list[ReferenceRow]:
    """Every key of every section, in the config models' order; or, with ``connector``, every
    connector key of ``kv_connector_extra_config`` (its other keys are ``kv`` keys)."""
    rows: list[ReferenceRow] = []
    _walk(_connector_settings() if connector else KVStackConfig, "", rows)
    return rows


def _connector_settings() -> type[BaseModel]:
    from kvstack.integrations.settings import ConnectorSettings  # only this table needs it

    return ConnectorSettings


def reference_markdown(connector: bool = False) -> str:
    """A markdown table of every section and key (or connector key, with ``connector``),
    generated from the config models."""
    lines = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    for row in reference_rows(connector):
        default = "required" if row.required else _show(row.default)
        description = row.description.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{row.key}` | {row.type} | {default} | {description} |")
    return "\n".join(lines)


def _walk(model: type[BaseModel], prefix: str, rows: list[ReferenceRow]) -> None:
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        nested = _model_of(field.annotation)
        if nested is not None:
            _walk(nested, f"{key}.", rows)
            continue
        required = field.is_required()
        default = None if required else field.get_default(call_default_factory=True)
        type_name = _type_name(field.annotation)
        rows.append(ReferenceRow(key, type_name, default, required, field.description or ""))
        item = _list_item_model(field.annotation)
        if item is not None:
            _walk(item, f"{key}[].", rows)


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
    if text.startswith("Optional[") and text.endswith("]"):  # how typing shows Literal[...] | None
        text = f"{text[len('Optional[') : -1]} | None"
    text = re.sub(r"\b(?:[a-z_]+\.)+([A-Z]\w*)", r"\1", text)  # kvstack.x.y.Model -> Model
    return text.replace(" | ", " or ").replace("NoneType", "None")


def _show(value: Any) -> str:
    text = json.dumps(to_jsonable_python(value))
    return f"`{text}`".replace("|", "\\|")


def run(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="kvstack config",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="action", required=True)
    show = sub.add_parser("show", help="print the effective configuration as YAML")
    show.add_argument("--config", help="YAML file (default: $KVSTACK_CONFIG)")
    reference = sub.add_parser("reference", help="print the reference as a markdown table")
    reference.add_argument(
        "--connector", action="store_true", help="the vLLM connector's keys instead"
    )
    for verb in (show, reference):
        add_json_flag(verb)
    args = parser.parse_args(argv)
    if args.action == "show":
        cfg = load_config(args.config)
        shown = redact_data(cfg.model_dump(mode="json"))  # SecretStr is masked by pydantic
        if args.json:
            return print_json(shown)
        print(yaml.safe_dump(shown, sort_keys=True), end="")
    elif args.json:
        rows = [{**row._asdict(), "default": to_jsonable_python(row.default)} for row in
                reference_rows(args.connector)]  # fmt: skip
        return print_json({"keys": rows})
    else:
        print(reference_markdown(args.connector))
    return 0
