"""Configuration of the ``index`` section."""

from __future__ import annotations

from kvstack.section import Section

__all__ = ["IndexConfig"]


class IndexConfig(Section):
    """Filled in by the component that owns this section."""
