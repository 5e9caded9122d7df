"""``kvstack bench vllm --scenario multi-turn | preemption``: KV that only decode produced.

**multi-turn.** Engine A answers turn one of ``--reps`` conversations (a long prompt, then a
few hundred generated tokens); engine B, another process sharing A's file tier, serves turn
two: turn one, its answer and a new question. Once with A saving generated tokens (the
default), once with ``save_generated: false``. Reported: B's TTFT for turn two (median,
min-max), the share of turn two's tokens B loaded from the tiers, and B's TTFT for a cold
prompt of the same length.

**preemption.** A KV budget of ``--preempt-blocks`` blocks and four requests that each grow
past a third of it: they preempt each other. Arms: the connector (a resumed request loads the
chunks it had completed, prompt and generated), the connector as ``kv_producer`` (it saves but
never loads: vLLM recomputes, the connector counts), and plain vLLM (wall time and vLLM's
preemption count; nothing inside it counts recomputed tokens). Per arm and round: recomputed
tokens, tokens recovered from the tiers, preemptions, wall time.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any

from kvstack.bench.micro.vllm_harness import (
    Engines,
    completion,
    metric_value,
    spread,
    stream_ttft,
)
from kvstack.bench.micro.vllm_probe import PromptFactory, reset_prefix_cache
from kvstack.stack.vllm_server import VLLMServer, connector_config

__all__ = ["multi_turn", "preemption"]

HITS = "kvstack_connector_hit_tokens_total"
CPU_BLOCK_TOKENS = 128  # vLLM's block size on its CPU build
PREEMPT_OUTPUT_TOKENS = 2000


def multi_turn(
    engines: Engines, prompts: PromptFactory, turn_one_tokens: int, answer_tokens: int, reps: int
) -> dict[str, Any]:
    tiers = ["cpu://?size=2GiB", f"file://{engines.work / 'turns-kv'}?size=20GiB"]
    question_tokens = 100
    results: dict[str, Any] = {
        "turn_one_tokens": turn_one_tokens, "answer_tokens": answer_tokens,
        "question_tokens": question_tokens, "reps": reps,
    }  # fmt: skip
    with engines.engine("turns-b", connector_config(tiers, chunk_size=256)) as b:
        stream_ttft(b, prompts(64))
        length = turn_one_tokens + answer_tokens + question_tokens
        results["cold_ttft_s"] = spread([stream_ttft(b, prompts(length)) for _ in range(reps)])
        for save_generated in (True, False):
            conversations = [prompts(turn_one_tokens) for _ in range(reps)]
            config = connector_config(tiers, chunk_size=256, save_generated=save_generated)
            with engines.engine(f"turns-a-{int(save_generated)}", config) as a:
                turns = [
                    c + completion(a, c, answer_tokens) + prompts(question_tokens)
                    for c in conversations
                ]
            label = "save_generated" if save_generated else "prompt_only"
            results[label] = _turn_two(b, turns)
    for key in ("cold_ttft_s",):
        results[key] = results[key].as_dict()
    return results


def _turn_two(b: VLLMServer, turns: list[list[int]]) -> dict[str, Any]:
    ttfts, shares = [], []
    for turn in turns:
        hits = metric_value(b, HITS)
        ttfts.append(stream_ttft(b, turn))
        time.sleep(1.5)  # stats reach /metrics a step later
        shares.append((metric_value(b, HITS) - hits) / len(turn))
    return {"ttft_s": spread(ttfts).as_dict(), "share_from_tiers": spread(shares).as_dict()}


def preemption(
    engines: Engines, prompts: PromptFactory, blocks: int, reps: int, prompt_tokens: int = 1000
) -> dict[str, Any]:
    # Four requests of 1000 + 2000 tokens: 24 blocks of 128 each, three would need 72.
    longest = prompt_tokens + PREEMPT_OUTPUT_TOKENS
    if blocks * CPU_BLOCK_TOKENS < longest:
        raise ValueError(
            f"--preempt-blocks {blocks} holds {blocks * CPU_BLOCK_TOKENS:,} tokens; one request "
            f"needs {longest:,} ({prompt_tokens:,} prompt + {PREEMPT_OUTPUT_TOKENS:,} generated)"
        )
    # vLLM refuses to start when one request of max_model_len would not fit the blocks.
    engines = dataclasses.replace(engines, max_model_len=longest)
    batch = [prompts(prompt_tokens) for _ in range(4)]
    extra = ["--num-gpu-blocks-override", str(blocks), "--max-num-seqs", "4"]
    tiers = ["cpu://?size=1GiB"]
    arms: dict[str, dict[str, Any] | None] = {
        "kvstack": connector_config(tiers, chunk_size=256),
        "kvstack_no_loads": connector_config(
            tiers, role="kv_producer", chunk_size=256, save_mode="async"
        ),
        "plain_vllm": None,
    }
    results: dict[str, Any] = {"blocks": blocks, "reps": reps, "requests": len(batch)}
    for name, config in arms.items():
        with engines.engine(f"preempt-{name}", config, extra_args=extra) as e:
            rounds = [_preempt_round(e, batch) for _ in range(reps)]
        results[name] = {"rounds": rounds} | {
            key: spread([r[key] for r in rounds]).as_dict()
            for key in ("recomputed_tokens", "recovered_tokens", "preemptions", "wall_s")
        }
    return results


_COUNTERS = {
    "recomputed_tokens": "kvstack_connector_recomputed_tokens_total",
    "recovered_tokens": "kvstack_connector_preemption_recovered_tokens_total",
    "preemptions": "vllm:num_preemptions_total",
}


def _preempt_round(engine: VLLMServer, batch: list[list[int]]) -> dict[str, float]:
    reset_prefix_cache(engine)
    before = {k: metric_value(engine, name) for k, name in _COUNTERS.items()}
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
        list(pool.map(lambda p: completion(engine, p, PREEMPT_OUTPUT_TOKENS), batch))
    wall = time.perf_counter() - start
    time.sleep(1.5)
    out = {k: metric_value(engine, name) - before[k] for k, name in _COUNTERS.items()}
    return out | {"wall_s": wall}
