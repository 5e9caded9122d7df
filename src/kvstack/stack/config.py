"""Configuration of the ``stack`` section."""

from __future__ import annotations

from kvstack.section import Section

__all__ = ["StackConfig"]


class StackConfig(Section):
    """Filled in by the component that owns this section."""
