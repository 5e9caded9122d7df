"""Configuration of the ``bench`` section."""

from __future__ import annotations

from kvstack.section import Section

__all__ = ["BenchConfig"]


class BenchConfig(Section):
    """Filled in by the component that owns this section."""
