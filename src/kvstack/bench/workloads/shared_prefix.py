"""``shared-prefix``: G groups x U users (llm-d's benchmark shape).

Each group has a system prompt of S tokens; each user of a group has a fixed question of Q
tokens; a request picks a (group, user) uniformly and asks for O output tokens. The reused
working set is ``G x S + G x U x Q`` tokens: size it against the fleet's KV capacity
(``engines x num_blocks x block_size``) to put the fleet under cache pressure.
"""

from __future__ import annotations

from pydantic import Field

from kvstack.bench.workloads.base import RequestSpec, Workload, WorkloadParams

__all__ = ["SharedPrefix"]


class SharedPrefixParams(WorkloadParams):
    groups: int = Field(default=8, gt=0, description="G: groups, one system prompt each")
    users_per_group: int = Field(default=5, gt=0, description="U: users (questions) per group")
    system_prompt_tokens: int = Field(default=2000, gt=0, description="S: system prompt tokens")
    question_tokens: int = Field(default=200, gt=0, description="Q: question tokens")
    output_tokens: int = Field(default=100, gt=0, description="O: answer tokens")


class SharedPrefix(Workload[SharedPrefixParams]):
    name = "shared-prefix"
    params_cls = SharedPrefixParams

    def setup(self) -> None:
        p = self.params
        content = self.content_rng
        self.systems = [self.builder.text(p.system_prompt_tokens, content) for _ in range(p.groups)]
        self.questions = [
            [self.builder.text(p.question_tokens, content) for _ in range(p.users_per_group)]
            for _ in range(p.groups)
        ]

    def next_request(self) -> RequestSpec:
        p = self.params
        group = self.rng.randrange(p.groups)
        user = self.rng.randrange(p.users_per_group)
        return self.spec(
            [self.questions[group][user]],
            p.output_tokens,
            system=self.systems[group],
            session=f"g{group}-u{user}",
        )

    def working_set_tokens(self) -> int:
        p = self.params
        return p.groups * (p.system_prompt_tokens + p.users_per_group * p.question_tokens)
