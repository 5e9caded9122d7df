"""Configuration of the ``router`` section."""

from __future__ import annotations

from kvstack.section import Section

__all__ = ["RouterConfig"]


class RouterConfig(Section):
    """Filled in by the component that owns this section."""
