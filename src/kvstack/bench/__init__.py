"""Benchmarks and load generation, above everything they measure.

- ``workloads/`` — seeded request streams by name, and prompts of exact token counts.
- ``load/`` — the streamed client, the load generator, summaries, ``kvstack bench serve``.
- ``compare/`` — ``kvstack bench compare``: fleets, front ends, the table and plots.
- ``micro/`` — one benchmark per component (kv, index, radix, shared, router, sim, vllm).
- ``plan/`` — ``kvstack plan``, the tier decider.
- ``demo/`` — ``kvstack demo``, the cache off vs on story.
"""
