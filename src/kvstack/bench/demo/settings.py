"""The demo's sizes, chosen for a 2-core machine (one core per engine), in one place.

The model is a random-weight Llama small enough to start fast and large enough that a cold
prefill of the story's document takes several seconds on one core. It runs in float32: on CPUs
without AVX-512 half-precision matrix units, vLLM's float16 and bfloat16 matmuls fall back to
slow kernels (measured on a 2-core AMD EPYC VM: a 2048x1024x2816 matmul took 27 s in float16
and 0.55 s in float32), while float32 is fast on every x86 CPU.

Each engine's own KV cache holds ``KV_BLOCKS`` blocks of 128 tokens: the story's document fits,
but the load workloads' working sets (10 documents of 1,024 tokens; conversations of ~1,100
tokens and growing) do not, as in production where many users compete for GPU memory.
"""

from __future__ import annotations

from typing import Any

from kvstack.models.toy import ToyModelSpec

__all__ = [
    "ANSWER_TOKENS",
    "CHUNK_TOKENS",
    "CONCURRENCY",
    "DEMO_MODEL",
    "DOCUMENT_TOKENS",
    "KV_BLOCKS",
    "KV_BYTES_PER_TOKEN",
    "MAX_MODEL_LEN",
    "QUESTION_TOKENS",
    "REQUESTS_PER_CELL",
    "SIM_PREFILL_TOKENS_PER_S",
    "TIERS",
    "WORKLOADS",
]

DEMO_MODEL = ToyModelSpec(
    hidden_size=512,
    num_layers=8,
    num_heads=8,
    num_kv_heads=2,
    intermediate_size=1408,
    vocab_size=8192,
    name="toy-llama-demo",
    dtype="float32",
)
KV_BYTES_PER_TOKEN = 2 * DEMO_MODEL.num_layers * DEMO_MODEL.num_kv_heads * 64 * 4  # 8 KiB

# -- the story ---------------------------------------------------------------------------------
DOCUMENT_TOKENS = 4096  # 16 kvstack chunks, 32 vLLM blocks: both caches hit it exactly
QUESTION_TOKENS = 24  # below one block: a hit computes only the question, in every path
ANSWER_TOKENS = 16
CHUNK_TOKENS = 256

# -- the engines ---------------------------------------------------------------------------
KV_BLOCKS = 40  # 5,120 tokens of each engine's own KV cache
MAX_MODEL_LEN = 4608
TIERS = ["file://{run_dir}/kv?size=4GiB"]  # one disk tier, shared by the kvstack engines
# Simulated engines (no vLLM; CI) prefill the document in ~2 s, so that their run stays short:
# their figures show the mechanism, not this machine's speed.
SIM_PREFILL_TOKENS_PER_S = 2000

# -- the load comparison -----------------------------------------------------------------------
REQUESTS_PER_CELL = 32
CONCURRENCY = 2  # closed loop: one request per engine at a time, on average
WORKLOADS: dict[str, dict[str, Any]] = {
    "multi-round-qa": {
        "num_users": 8, "num_rounds": 4, "system_prompt_tokens": 256,
        "user_context_tokens": 1024, "question_tokens": 24, "output_tokens": 16,
    },
    "long-doc-qa": {
        "num_documents": 10, "document_tokens": 1024, "question_tokens": 24, "output_tokens": 16,
    },
}  # fmt: skip
