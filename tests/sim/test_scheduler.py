"""Scheduler semantics, stepped by hand: prefix hits, evictions, preemption, LoRA slots,
chunked prefill and priorities."""

from __future__ import annotations

from typing import Any

from kvstack.sim.blocks import BlockPool
from kvstack.sim.config import SimConfig
from kvstack.sim.hashing import none_hash
from kvstack.sim.lora import LoRASlots
from kvstack.sim.request import Adapter, FinishReason, SimRequest
from kvstack.sim.scheduler import Scheduler, StepOutcome


def make(**overrides: Any) -> Scheduler:
    cfg = SimConfig(**({"block_size": 4, "num_blocks": 16, "max_model_len": 64} | overrides))
    slots = LoRASlots(cfg.max_loras, cfg.cpu_lora_capacity, cfg.lora_load_s, cfg.lora_activate_s)
    return Scheduler(cfg, BlockPool(cfg.num_blocks), slots, none_hash(cfg.hash_seed))


def req(rid: str, prompt: list[int], max_tokens: int = 2, **kw: Any) -> SimRequest:
    return SimRequest(rid, list(prompt), len(prompt), max_tokens, arrival_s=0.0, **kw)


def run_all(s: Scheduler, now: float = 0.0) -> list[StepOutcome]:
    outcomes = []
    while True:
        step = s.schedule(now)
        if step is None:
            return outcomes
        now += step.duration_s
        outcomes.append(s.complete(step, now))
        s.pool.check_integrity()


PROMPT = list(range(100, 110))  # 10 tokens: 2 full blocks of 4, then 2 tokens


def test_a_repeated_prompt_hits_its_full_blocks() -> None:
    s = make()
    first = req("a", PROMPT)
    s.add(first)
    outcomes = run_all(s)
    assert first.finish_reason is FinishReason.LENGTH and first.num_output == 2
    assert first.local_hit_tokens == 0
    stored = [sb for o in outcomes for sb in o.stored]
    # 10 prompt tokens + 1 decoded (the last sampled token is never computed): 2 full blocks
    assert sum(len(sb.block_hashes) for sb in stored) == 2
    second = req("b", PROMPT)
    s.add(second)
    run_all(s)
    assert second.local_hit_tokens == 8


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    s = make()
    s.add(req("a", list(range(100, 113)), max_tokens=1))  # 13 tokens: 3 full blocks
    run_all(s)
    again = req("b", list(range(100, 112)), max_tokens=1)  # 12 tokens, all cached
    s.add(again)
    run_all(s)
    assert again.local_hit_tokens == 8  # at most num_tokens - 1 -> 2 blocks


def test_eviction_drops_the_oldest_prefix_and_reports_it() -> None:
    s = make(num_blocks=16)
    for i in range(6):  # each 3 blocks; 16 blocks cannot keep all of them
        s.add(req(f"r{i}", [1000 * (i + 1) + k for k in range(12)], max_tokens=1))
        run_all(s)
    removed = s.pool.take_events()
    assert removed and all(kind == "removed" for kind, _ in removed)
    late = req("again-last", [6000 + k for k in range(12)], max_tokens=1)
    early = req("again-first", [1000 + k for k in range(12)], max_tokens=1)
    s.add(late)
    s.add(early)
    run_all(s)
    assert late.local_hit_tokens == 8 and early.local_hit_tokens == 0


def test_preemption_when_decode_runs_out_of_blocks() -> None:
    s = make(num_blocks=6, max_model_len=24)
    a = req("a", list(range(100, 108)), max_tokens=12)  # grows to 20 tokens = 5 blocks
    b = req("b", list(range(200, 208)), max_tokens=12)
    s.add(a)
    s.add(b)
    run_all(s)
    assert a.finish_reason is FinishReason.LENGTH and b.finish_reason is FinishReason.LENGTH
    assert a.num_preemptions + b.num_preemptions >= 1
    assert b.num_preemptions >= 1  # the later request is the victim
    assert s.pool.num_free == 6


def test_chunked_prefill_respects_the_token_budget() -> None:
    s = make(max_num_batched_tokens=4, num_blocks=32, max_model_len=64)
    r = req("a", list(range(100, 118)), max_tokens=1)
    s.add(r)
    sizes = []
    while (step := s.schedule(0.0)) is not None:
        sizes.append(step.num_tokens)
        assert step.cost.prefill_tokens == step.num_tokens
        s.complete(step, 0.0)
    assert sizes == [4, 4, 4, 4, 2]


def test_lora_slots_limit_distinct_adapters_per_batch() -> None:
    s = make(enable_lora=True, max_loras=1, lora_load_s=0.5, lora_activate_s=0.1)
    a1, a2 = Adapter("a1", "/p1", 1), Adapter("a2", "/p2", 2)
    s.loras.register(a1)
    s.loras.register(a2)  # host holds max_loras=1: a1 falls out of host memory
    x = req("x", list(range(100, 106)), max_tokens=3, adapter=a1)
    y = req("y", list(range(200, 206)), max_tokens=3, adapter=a2)
    z = req("z", list(range(300, 306)), max_tokens=3)  # base model: never deferred
    for r in (x, y, z):
        s.add(r)
    step = s.schedule(0.0)
    assert step is not None
    assert {r.request_id for r, _ in step.work} == {"x", "z"}  # y deferred, z passes it
    assert step.cost.lora_s == 0.6  # a1: reload from storage + activate
    run_all(s, step.duration_s)
    assert y.scheduled_s is not None and y.scheduled_s >= x.finished_s  # type: ignore[operator]
    assert s.loras.resident() == ["a2"]


def test_lora_blocks_do_not_match_base_model_blocks() -> None:
    s = make(enable_lora=True)
    s.loras.register(Adapter("a1", "/p1", 1))
    s.add(req("base", PROMPT, max_tokens=1))
    run_all(s)
    tuned = req("tuned", PROMPT, max_tokens=1, adapter=s.loras.get("a1"))
    s.add(tuned)
    run_all(s)
    assert tuned.local_hit_tokens == 0


def test_priority_policy_admits_lower_values_first() -> None:
    s = make(scheduling_policy="priority", max_num_seqs=1)
    late = req("late", list(range(100, 104)), max_tokens=1, priority=5)
    urgent = req("urgent", list(range(200, 204)), max_tokens=1, priority=-1)
    s.add(late)
    s.add(urgent)
    step = s.schedule(0.0)
    assert step is not None and [r.request_id for r, _ in step.work] == ["urgent"]


def test_step_cost_counts_prefill_and_decode() -> None:
    s = make(step_base_s=0.01, prefill_tokens_per_s=1000.0, decode_per_seq_s=0.001,
             decode_per_context_token_s=0.0)  # fmt: skip
    s.add(req("a", list(range(100, 120)), max_tokens=3))
    first = s.schedule(0.0)
    assert first is not None
    assert abs(first.duration_s - (0.01 + 20 / 1000.0)) < 1e-12
    s.complete(first, first.duration_s)
    second = s.schedule(first.duration_s)
    assert second is not None and second.cost.decode_seqs == 1
    assert abs(second.duration_s - 0.011) < 1e-12


def test_abort_frees_blocks_at_the_next_step() -> None:
    s = make()
    r = req("a", PROMPT, max_tokens=5)
    s.add(r)
    step = s.schedule(0.0)
    assert step is not None
    s.complete(step, 0.1)
    r.aborted = True
    run_all(s)
    assert r.finish_reason is FinishReason.ABORT
    assert s.pool.num_free == s.pool.num_blocks


def test_a_step_never_admits_a_request_from_its_future() -> None:
    # When the engine catches up on steps it woke late for, a step that starts at t=1.0 must
    # not serve a request that arrived at t=1.5 (its time to first token would be too short).
    s = make()
    late = SimRequest("late", list(range(100, 104)), 4, 1, arrival_s=1.5)
    s.add(late)
    assert s.schedule(1.0) is None
    assert s.next_arrival() == 1.5
    step = s.schedule(1.5)
    assert step is not None and [r.request_id for r, _ in step.work] == ["late"]
