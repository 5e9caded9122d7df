"""Integrations with serving engines. ``integrations.vllm`` is the only package importing vLLM."""
