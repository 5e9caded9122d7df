"""Typed readers for remote tier URL parameters; bad values raise ConfigError naming the
parameter, the URL and the allowed range."""

from __future__ import annotations

from kvstack.errors import ConfigError
from kvstack.kv.format import COMPRESSIONS
from kvstack.kv.tiers.base import TierURL
from kvstack.section import parse_size

__all__ = ["pop_bool", "pop_compression", "pop_float", "pop_int", "pop_size"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def pop_float(url: TierURL, name: str, default: float, minimum: float = 0.0) -> float:
    raw = url.pop(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} in tier URL {url.url!r} is not a number") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw} in tier URL {url.url!r} must be >= {minimum}")
    return value


def pop_int(url: TierURL, name: str, default: int, minimum: int = 0) -> int:
    raw = url.pop(name)
    if raw is None or raw == "":
        return default
    if not raw.lstrip("-").isdigit():
        raise ConfigError(f"{name}={raw!r} in tier URL {url.url!r} is not an integer")
    value = int(raw)
    if value < minimum:
        raise ConfigError(f"{name}={raw} in tier URL {url.url!r} must be >= {minimum}")
    return value


def pop_bool(url: TierURL, name: str, default: bool) -> bool:
    raw = url.pop(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} in tier URL {url.url!r} must be true or false")


def pop_size(url: TierURL, name: str, default: str) -> int:
    return parse_size(url.pop(name) or default, f"{name} in tier URL {url.url!r}")


def pop_compression(url: TierURL) -> str:
    value = url.pop("compression") or "none"
    if value not in COMPRESSIONS:
        raise ConfigError(
            f"compression={value!r} in tier URL {url.url!r}; known: {', '.join(COMPRESSIONS)}"
        )
    return value
