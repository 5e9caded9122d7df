"""Component benchmarks: KV tiers, the index, the radix tree, shared tiers, the router, the
simulator and a real vLLM engine, each ``kvstack bench <name>`` with its measurements."""
