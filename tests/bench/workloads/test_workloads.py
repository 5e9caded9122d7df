"""Workloads: exact token counts, seeded reproducibility, the shapes the issue describes."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

from kvstack.bench.workloads import WORKLOADS, make_workload
from kvstack.bench.workloads.prompts import SimPromptBuilder
from kvstack.bench.workloads.zipf import ZipfSampler
from kvstack.errors import ConfigError

BUILDER = SimPromptBuilder()
SMALL: dict[str, dict[str, Any]] = {
    "multi-round-qa": {
        "num_users": 3,
        "system_prompt_tokens": 50,
        "user_context_tokens": 20,
        "question_tokens": 10,
        "output_tokens": 5,
    },
    "shared-prefix": {
        "groups": 3,
        "users_per_group": 2,
        "system_prompt_tokens": 40,
        "question_tokens": 7,
        "output_tokens": 4,
    },
    "long-doc-qa": {"num_documents": 2, "document_tokens": 300, "question_tokens": 9},
    "lora-zipf": {"num_adapters": 5, "system_prompt_tokens": 10, "prompt_tokens": 12},
    "unique": {"prompt_tokens": 33, "output_tokens": 3},
}


def specs(name: str, seed: int, n: int = 20, **over: Any) -> list[Any]:
    workload = make_workload(name, SMALL[name] | over, BUILDER, seed)
    out = []
    for _ in range(n):
        spec = workload.next_request()
        out.append(spec)
        workload.on_complete(spec, True, BUILDER.text(5, workload.rng))
    return out


def test_every_workload_is_registered() -> None:
    assert set(WORKLOADS.names()) == set(SMALL)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_same_seed_same_requests_other_seed_other_requests(name: str) -> None:
    first, again, other = specs(name, 1), specs(name, 1), specs(name, 2)
    assert first == again
    assert first != other


@pytest.mark.parametrize("name", sorted(SMALL))
def test_expected_token_counts_are_the_simulators(name: str) -> None:
    for spec in specs(name, 3):
        if spec.api == "chat":
            assert spec.expected_prompt_tokens == len(
                BUILDER.tokenizer.apply_chat_template(spec.messages)
            )
        else:
            assert spec.expected_prompt_tokens == len(BUILDER.tokenizer.encode(spec.prompt))


def test_shared_prefix_shape() -> None:
    out = specs("shared-prefix", 0, n=200)
    prompts = {s.prompt for s in out}
    assert len(prompts) == 3 * 2  # G x U distinct prompts, each reused
    assert all(s.expected_prompt_tokens == 47 and s.max_tokens == 4 for s in out)
    systems = {tuple(s.prompt.split()[:40]) for s in out}
    assert len(systems) == 3  # one system prompt per group
    w = make_workload("shared-prefix", SMALL["shared-prefix"], BUILDER, 0)
    assert w.working_set_tokens() == 3 * (40 + 2 * 7)


def test_multi_round_resends_the_history() -> None:
    out = specs("multi-round-qa", 0, n=9)  # 3 users, each asked 3 times, answers fed back
    by_user: dict[str, list[int]] = {}
    for s in out:
        by_user.setdefault(s.session, []).append(s.expected_prompt_tokens)
    assert len(by_user) == 3
    for lengths in by_user.values():
        # a round adds the question (10) and answer (5), each wrapped in role and end tokens
        steps = [b - a for a, b in itertools.pairwise(lengths)]
        assert steps == [10 + 5 + 4] * (len(lengths) - 1)
    first = out[0].messages
    assert first[0]["role"] == "system" and first[-1]["role"] == "user"


def test_multi_round_opens_conversations_when_every_user_waits() -> None:
    w = make_workload("multi-round-qa", SMALL["multi-round-qa"], BUILDER, 0)
    sessions = {w.next_request().session for _ in range(5)}  # no answers came back
    assert len(sessions) == 5


def test_lora_zipf_popularity_classes_and_tiers() -> None:
    # 5 adapters: platinum and gold get one each (at least one per tier), standard round(4.0).
    out = specs("lora-zipf", 0, n=4000, num_adapters=5, zipf_s=1.0)
    counts = Counter(s.adapter for s in out)
    expected = {"platinum-0000": 0.30, "gold-0000": 0.40}  # the tiers' traffic shares
    sampler = ZipfSampler(4, 1.0)  # Zipf within the standard tier
    expected |= {f"standard-{k:04d}": 0.30 * sampler.probabilities[k] for k in range(4)}
    assert set(counts) == set(expected)
    for name, share in expected.items():
        assert abs(counts[name] / 4000 - share) < 0.03
    assert all(s.model == s.adapter for s in out)
    interactive = sum(1 for s in out if s.priority == "critical") / len(out)
    assert abs(interactive - 0.7) < 0.03
    assert {s.priority for s in out} == {"critical", "sheddable"}
    assert {s.max_tokens for s in out if s.priority == "sheddable"} == {256}
    tiers = {s.adapter: s.tenant for s in out}
    assert tiers["platinum-0000"] == "platinum" and tiers["standard-0003"] == "standard"


def test_unique_never_repeats() -> None:
    out = specs("unique", 0, n=50)
    assert len({s.prompt for s in out}) == 50


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ConfigError, match=r"shared-prefix.*groups.*greater than 0"):
        make_workload("shared-prefix", {"groups": 0}, BUILDER, 0)
    with pytest.raises(ConfigError, match="unknown workload 'nope'"):
        make_workload("nope", {}, BUILDER, 0)
    twice = [{"name": "gold", "adapter_fraction": 0.5, "traffic_share": 0.5}] * 2
    with pytest.raises(ConfigError, match=r"tiers.*distinct names"):
        make_workload("lora-zipf", {"tiers": twice}, BUILDER, 0)
    too_much = [{"name": "gold", "adapter_fraction": 1.0, "traffic_share": 1.5}]
    with pytest.raises(ConfigError, match=r"tiers\.0\.traffic_share"):
        make_workload("lora-zipf", {"tiers": too_much}, BUILDER, 0)
