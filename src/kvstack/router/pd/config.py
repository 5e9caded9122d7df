"""Configuration of prefill/decode disaggregation: the ``pd`` subsection of ``router``::

router:
  pd:
    models: [llama-8b]
    min_remote_prefill_tokens: 512
"""

from __future__ import annotations

from pydantic import Field

from kvstack.section import Section

__all__ = ["PDConfig"]


class PDConfig(Section):
    models: list[str] = Field(
        default_factory=list,
        description="models (targets) served disaggregated: prefill on a 'prefill' backend, "
        "decode on a 'decode' backend, KV through kvstack's shared tier",
    )
    min_remote_prefill_tokens: int = Field(
        default=256,
        ge=0,
        description="prefill remotely only when the decode backend would compute at least "
        "this many prompt tokens itself (shorter suffixes are cheaper to prefill in place)",
    )
    prefill_timeout_s: float = Field(
        default=120.0, gt=0, description="the prefill step's own timeout"
    )
