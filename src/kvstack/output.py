"""How commands print what they report: human lines by default, ``--json`` for scripts.

Every subcommand that reports data a script would read takes ``--json`` (:func:`add_json_flag`)
and then writes exactly one JSON document to stdout (:func:`print_json`): stable keys, sorted,
times as ISO-8601 strings like the human output (:func:`iso_time`); progress and warnings go to
stderr either way. A leaf: imports nothing of kvstack.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

__all__ = ["JSON_HELP", "add_json_flag", "iso_time", "print_json"]

JSON_HELP = "print one JSON document on stdout (for scripts) instead of text"


def add_json_flag(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give ``parser`` the ``--json`` flag (``args.json``); returns the parser."""
    parser.add_argument("--json", action="store_true", help=JSON_HELP)
    return parser


def print_json(value: Any) -> int:
    """Write ``value`` as one JSON document (sorted keys, 2-space indent); returns 0."""
    print(json.dumps(value, indent=2, sort_keys=True, default=str))
    return 0


def iso_time(epoch_s: float) -> str:
    """``2026-12-01T18:36:48.123Z``: ISO-8601 in UTC, as listings print times."""
    moment = datetime.fromtimestamp(epoch_s, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
