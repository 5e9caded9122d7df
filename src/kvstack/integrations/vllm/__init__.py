"""kvstack's vLLM integration: ``KVStackConnector`` (see :mod:`.connector`).

This package is the only place in kvstack that imports vLLM. The connector is exported lazily:
vLLM imports this package by name to find the class, and the copy machinery (:mod:`.streams`,
:mod:`.loads`, :mod:`.sync_loads`, :mod:`.saves`) imports no vLLM module at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvstack.integrations.vllm.connector import KVStackConnector

__all__ = ["KVStackConnector"]


def __getattr__(name: str) -> Any:
    if name == "KVStackConnector":
        from kvstack.integrations.vllm.connector import KVStackConnector

        return KVStackConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
