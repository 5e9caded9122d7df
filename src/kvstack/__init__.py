"""kvstack: a KV-cache and adapter layer for LLM serving.

Packages: ``kv`` (tiered chunk store), ``index`` (prefix index), ``integrations`` (vLLM
connector), ``router`` (OpenAI gateway), ``lora`` (adapter control plane), ``sim`` (simulated
engines), ``bench`` (load generator and comparisons), ``stack`` (local stack and demo).
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
