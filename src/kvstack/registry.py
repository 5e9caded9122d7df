"""A tiny registry of named implementations, imported lazily by ``module:attribute`` path.

Plugins (tiers, eviction policies, scorers, filters, pickers) register by name so that a new
one is one new file plus one line, and heavy modules are imported only when used.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Generic, TypeVar

from kvstack.errors import ConfigError
from kvstack.extras import extra_for, missing_extra

T = TypeVar("T")

__all__ = ["Registry"]


class Registry(Generic[T]):
    """Maps names to objects or to lazy ``"package.module:attr"`` references."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T | str] = {}

    def register(self, name: str, target: T | str) -> None:
        """Register ``target`` (an object or a ``module:attr`` string) under ``name``."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = target

    def get(self, name: str) -> T:
        """Return the entry for ``name``; raises :class:`ConfigError` listing the known names."""
        try:
            target = self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "none"
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {known}") from None
        if isinstance(target, str):
            module_name, _, attr = target.partition(":")
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if extra_for(exc) is None:
                    raise
                raise missing_extra(exc, f"the {self.kind} {name!r}") from None
            resolved: T = getattr(module, attr)
            self._entries[name] = resolved
            return resolved
        return target

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
