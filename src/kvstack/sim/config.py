"""Configuration of the ``sim`` section."""

from __future__ import annotations

from kvstack.section import Section

__all__ = ["SimConfig"]


class SimConfig(Section):
    """Filled in by the component that owns this section."""
