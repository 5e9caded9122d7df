"""``multi-round-qa``: users hold conversations; each turn resends the whole history.

The shape of LMCache's and production-stack's multi-round QA benchmark: every conversation
starts with a shared system prompt and a per-user context, then each round appends a question
and, once it arrives, the answer. A user asks the next question only after the previous
answer came back: ``next_request`` picks an idle user (oldest first); when every user is
waiting for an answer it starts another conversation, so under overload the number of open
conversations grows beyond ``num_users``, as with real traffic. A conversation ends after
``num_rounds`` rounds and a new user takes its place. Questions are drawn from a per-user
random stream, so the content of (user, round) is the same in every run with the seed.
Requests use the chat API; ``x-session-id`` is the user.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field

from kvstack.bench.workloads.base import RequestSpec, Workload, WorkloadParams

__all__ = ["MultiRoundQA"]


class MultiRoundQAParams(WorkloadParams):
    api: Literal["chat"] = Field(default="chat", description="always chat (history of turns)")
    num_users: int = Field(default=10, gt=0, description="conversations kept open")
    num_rounds: int = Field(default=5, gt=0, description="questions per conversation")
    system_prompt_tokens: int = Field(default=1000, ge=0, description="shared system prompt")
    user_context_tokens: int = Field(default=2000, ge=0, description="per-user context")
    question_tokens: int = Field(default=100, gt=0, description="tokens per question")
    output_tokens: int = Field(default=100, gt=0, description="tokens per answer")


@dataclass
class _User:
    user_id: int
    rng: random.Random
    history: list[dict[str, str]] = field(default_factory=list)
    rounds: int = 0
    busy: bool = False


class MultiRoundQA(Workload[MultiRoundQAParams]):
    name = "multi-round-qa"
    params_cls = MultiRoundQAParams

    def setup(self) -> None:
        p = self.params
        self.system = self.builder.text(p.system_prompt_tokens, self.content_rng)
        self._next_id = 0
        self.idle: deque[_User] = deque(self._new_user() for _ in range(p.num_users))

    def _new_user(self) -> _User:
        user = _User(self._next_id, random.Random(f"{self.seed}:{self._next_id}"))
        self._next_id += 1
        context = self.builder.text(self.params.user_context_tokens, user.rng)
        system = self.system + context
        if system:
            user.history.append({"role": "system", "content": system})
        return user

    def next_request(self) -> RequestSpec:
        p = self.params
        user = self.idle.popleft() if self.idle else self._new_user()
        user.busy = True
        question = self.builder.text(p.question_tokens, user.rng)
        messages = [*user.history, {"role": "user", "content": question}]
        return RequestSpec(
            "chat",
            p.output_tokens,
            messages=messages,
            expected_prompt_tokens=self.builder.count_chat(messages),
            model=p.model,
            priority=p.priority,
            session=f"user-{user.user_id}",
            context=(user, question),
        )

    def on_complete(self, spec: RequestSpec, ok: bool, text: str) -> None:
        user, question = spec.context
        user.busy = False
        if ok:
            user.history += [
                {"role": "user", "content": question},
                {"role": "assistant", "content": text},
            ]
            user.rounds += 1
        if user.rounds >= self.params.num_rounds:
            user = self._new_user()
        self.idle.append(user)

    def working_set_tokens(self) -> int:
        p = self.params
        per_user = p.user_context_tokens + p.num_rounds * (p.question_tokens + p.output_tokens)
        return p.system_prompt_tokens + p.num_users * per_user
