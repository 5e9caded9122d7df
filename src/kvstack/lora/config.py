"""Configuration of the ``lora`` section."""

from __future__ import annotations

from kvstack.section import Section

__all__ = ["LoRAConfig"]


class LoRAConfig(Section):
    """Filled in by the component that owns this section."""
