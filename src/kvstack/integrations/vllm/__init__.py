"""kvstack's vLLM integration: ``KVStackConnector`` (see :mod:`.connector`).

This package is the only place in kvstack that imports vLLM.
"""

from kvstack.integrations.vllm.connector import KVStackConnector

__all__ = ["KVStackConnector"]
