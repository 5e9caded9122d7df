"""The workload interface: a stream of request specs, with feedback for conversations.

``next_request()`` is called once per arrival (open loop) or whenever a closed-loop worker is
free, so for a given seed the i-th call returns the same spec in every run. Multi-turn
workloads learn each answer through ``on_complete`` and put it into that user's history.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import Field

from kvstack.bench.workloads.prompts import PromptBuilder
from kvstack.section import Section

__all__ = ["Api", "RequestSpec", "Workload", "WorkloadParams"]

Api = Literal["completions", "chat"]


class WorkloadParams(Section):
    """Fields shared by every workload."""

    api: Api = Field(default="completions", description="completions or chat")
    model: str | None = Field(default=None, description="model name (None: the server's first)")
    priority: str = Field(default="standard", description="x-kvstack-priority of every request")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    api: Api
    max_tokens: int
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    expected_prompt_tokens: int | None = None
    model: str | None = None
    priority: str = "standard"
    adapter: str | None = None
    tenant: str | None = None
    session: str | None = None
    context: Any = field(default=None, compare=False)  # workload bookkeeping

    def body(self, default_model: str) -> dict[str, Any]:
        """The JSON body: exact output length (``ignore_eos``), usage in streams."""
        body: dict[str, Any] = {
            "model": self.model or default_model,
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.api == "chat":
            body["messages"] = self.messages
        else:
            body["prompt"] = self.prompt
        return body


P = TypeVar("P", bound=WorkloadParams)


class Workload(ABC, Generic[P]):
    name: ClassVar[str]
    params_cls: ClassVar[type[WorkloadParams]]

    def __init__(self, params: P, builder: PromptBuilder, seed: int) -> None:
        self.params = params
        self.builder = builder
        self.seed = seed
        self.rng = random.Random(seed)  # request choices, in call order
        self.content_rng = random.Random(seed ^ 0x5EED)  # fixed texts built at setup
        self.setup()

    def setup(self) -> None:
        """Build the workload's fixed texts (system prompts, documents)."""

    @abstractmethod
    def next_request(self) -> RequestSpec:
        """The next request to send."""

    def on_complete(self, spec: RequestSpec, ok: bool, text: str) -> None:
        """Feedback after a request ended (``text``: the generated answer)."""

    def adapters(self) -> list[str]:
        """LoRA adapters the requests name (they must be loaded on the engines)."""
        return []

    def working_set_tokens(self) -> int | None:
        """Distinct prompt tokens the workload keeps reusing (None: no reuse to speak of)."""
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "params": self.params.model_dump(),
            "seed": self.seed,
            "working_set_tokens": self.working_set_tokens(),
        }

    # -- helpers for subclasses ------------------------------------------------------------
    def spec(
        self, prompt_parts: list[str], max_tokens: int, system: str | None = None, **kw: Any
    ) -> RequestSpec:
        """A spec whose prompt is ``system`` + the parts (one user message for chat)."""
        p = self.params
        kw.setdefault("priority", p.priority)
        kw.setdefault("model", p.model)
        if p.api == "chat":
            messages = [] if system is None else [{"role": "system", "content": system}]
            messages.append({"role": "user", "content": "".join(prompt_parts)})
            expected = self.builder.count_chat(messages)
            return RequestSpec(
                "chat",
                max_tokens,
                messages=messages,
                expected_prompt_tokens=expected,
                **kw,
            )
        text = (system or "") + "".join(prompt_parts)
        expected = self.builder.count(text)
        return RequestSpec(
            "completions",
            max_tokens,
            prompt=text,
            expected_prompt_tokens=expected,
            **kw,
        )
