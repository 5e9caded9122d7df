"""``kvstack config show | reference``: the effective configuration, or its reference table."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvstack.config import KVStackConfig, load_config

__all__ = ["reference_markdown", "run"]


def reference_markdown() -> str:
    """A markdown reference of every section and key, generated from the config schema."""
    lines = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    schema = KVStackConfig.model_json_schema()
    defs = schema.get("$defs", {})

    def walk(props: dict[str, Any], prefix: str, required: set[str]) -> None:
        for name, prop in props.items():
            ref = prop.get("$ref") or next(
                (p.get("$ref") for p in prop.get("anyOf", []) if "$ref" in p), None
            )
            key = f"{prefix}{name}"
            if ref:
                sub = defs[ref.split("/")[-1]]
                walk(sub.get("properties", {}), f"{key}.", set(sub.get("required", [])))
                continue
            kind = prop.get("type") or " | ".join(p.get("type", "?") for p in prop.get("anyOf", []))
            default = (
                json.dumps(prop["default"])
                if "default" in prop
                else ("required" if name in required else "")
            )
            desc = (prop.get("description") or "").replace("|", "\\|")
            lines.append(f"| `{key}` | {kind} | `{default}` | {desc} |")

    walk(schema["properties"], "", set())
    return "\n".join(lines)


def run(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvstack config", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    show = sub.add_parser("show", help="print the effective configuration as JSON")
    show.add_argument("--config", help="YAML file (default: $KVSTACK_CONFIG)")
    sub.add_parser("reference", help="print the configuration reference as a markdown table")
    args = parser.parse_args(argv)
    if args.action == "show":
        cfg = load_config(args.config)
        print(json.dumps(cfg.model_dump(mode="json"), indent=2, sort_keys=True))
    else:
        print(reference_markdown())
    return 0
