"""The base of every config section and the size parser shared by tier URLs and configs.

Kept apart from :mod:`kvstack.config` so that section modules can import it without a cycle.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from kvstack.errors import ConfigError

__all__ = ["Section", "format_size", "parse_size"]


class Section(BaseModel):
    """Base of every config section: unknown keys are errors; assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
    "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30,
    "ti": 2**40, "tib": 2**40,
}  # fmt: skip
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int, what: str = "size") -> int:
    """Parse ``"8GiB"``, ``"512MB"``, ``"1.5G"`` or a plain byte count into bytes (>= 0)."""
    if isinstance(text, int):
        if text < 0:
            raise ConfigError(f"{what} must be >= 0 bytes, got {text}")
        return text
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise ConfigError(
            f"{what} {text!r} is not a size; use a number with an optional unit such as "
            "512MiB, 8GiB or 100GB"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def format_size(num_bytes: float) -> str:
    """Human-readable binary size, e.g. ``32.0 MiB``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    raise AssertionError("unreachable")
