"""``kvstack plan``: whether KV tiers pay off for a workload on given hardware."""
